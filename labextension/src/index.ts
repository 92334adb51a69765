/**
 * The cortex-nb JupyterLab extension: a left-sidebar panel (connection, devices, jobs, finished
 * trainings), job and comparison views in the main area, palette commands, and "Open in sidebar" links
 * from notebook outputs.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, Notification, Sanitizer, WidgetTracker } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { CortexApi } from './api';
import { IDrawnRecord, installCellRecords } from './cellrecord';
import { JOB_TERMINAL } from './contract';
import { CommandIDs, registerCommands } from './commands';
import { cortexIcon } from './icon';
import { jobLabel, sortJobs } from './jobrows';
import { PanelModel } from './model';
import { installOpenJobListener } from './openlink';
import { PanelRefresher } from './refresher';
import { sidebarActions } from './sidebaractions';
import { CompareView } from './widgets/compareview';
import { JobView } from './widgets/jobview';
import { CortexSidebar } from './widgets/sidebar';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'cortex-nb:plugin',
  description: 'cortex-nb sidebar: GPUs, jobs, training progress, logs and metrics from the cortex-nb backend',
  autoStart: true,
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (app: JupyterFrontEnd, palette: ICommandPalette | null, restorer: ILayoutRestorer | null) => {
    const api = new CortexApi();
    const model = new PanelModel();
    // The bell: this user's runs that end, fail or start waiting, with what to do next.
    const refresher = new PanelRefresher(api, model, 3000, notice => {
      Notification.emit(notice.message, notice.type, {
        autoClose: notice.type === 'error' ? false : 8000,
        actions: [
          {
            label: 'Open in sidebar',
            callback: () => void app.commands.execute(CommandIDs.openJob, { jobId: notice.jobId })
          },
          {
            label: 'Insert %cortex job ID',
            caption: 'Insert the line that shows this job into the active notebook (or copy it when none is)',
            callback: () => void actions.insertJobLine(notice.jobId)
          }
        ]
      });
    });
    const actions = sidebarActions(app, api, model, refresher);
    const jobs = new WidgetTracker<MainAreaWidget<JobView>>({ namespace: 'cortex-nb-job' });
    const comparisons = new WidgetTracker<MainAreaWidget<CompareView>>({ namespace: 'cortex-nb-compare' });

    /** Open `content` in the main area (its tab follows the content's title: the job's name). */
    const show = <T extends Widget>(tracker: WidgetTracker<MainAreaWidget<T>>, content: T): void => {
      const widget = new MainAreaWidget({ content });
      widget.id = `${content.id}-tab`;
      widget.title.icon = cortexIcon;
      void tracker.add(widget);
      app.shell.add(widget, 'main');
      app.shell.activateById(widget.id);
    };

    const openJob = (jobId: string): void => {
      const open = jobs.find(widget => widget.content.jobId === jobId);
      if (open) {
        app.shell.activateById(open.id);
      } else {
        show(jobs, new JobView(api, jobId));
      }
      app.shell.activateById(sidebar.id);
    };

    const compare = (jobIds: string[]): void => {
      const key = jobIds.join(',');
      const open = comparisons.find(widget => widget.content.jobIds.join(',') === key);
      if (open) {
        app.shell.activateById(open.id);
        return;
      }
      show(comparisons, new CompareView(api, jobIds));
    };

    const sidebar = new CortexSidebar(model, {
      openJob: jobId => void app.commands.execute(CommandIDs.openJob, { jobId }),
      refresh: () => void app.commands.execute(CommandIDs.refresh),
      startLocal: () => void refresher.startLocalBackend(),
      compare: jobIds => void app.commands.execute(CommandIDs.compare, { jobIds }),
      ...actions
    });
    sidebar.title.icon = cortexIcon;
    sidebar.title.caption = 'Cortex: GPUs and jobs';
    app.shell.add(sidebar, 'left', { rank: 900 });

    registerCommands(app.commands, {
      refresh: async () => {
        await Promise.all([
          refresher.refresh(),
          ...jobs.filter(() => true).map(w => w.content.refreshNow()),
          ...comparisons.filter(() => true).map(w => w.content.refreshNow())
        ]);
      },
      openJob,
      compare,
      showSidebar: () => app.shell.activateById(sidebar.id),
      recentJobs: () => sortJobs(model.state.jobs).map(job => ({ jobId: job.job_id, label: jobLabel(job) })),
      compareSelection: () => model.state.compareSelection
    });
    if (palette) {
      for (const command of [CommandIDs.refresh, CommandIDs.openJob, CommandIDs.compare]) {
        palette.addItem({ command, category: 'Cortex' });
      }
    }
    if (restorer) {
      restorer.add(sidebar, 'cortex-nb-sidebar');
      void restorer.restore(jobs, {
        command: CommandIDs.openJob,
        args: widget => ({ jobId: widget.content.jobId }),
        name: widget => widget.content.jobId
      });
      void restorer.restore(comparisons, {
        command: CommandIDs.compare,
        args: widget => ({ jobIds: widget.content.jobIds }),
        name: widget => widget.content.jobIds.join(',')
      });
    }
    installOpenJobListener(document, jobId => {
      void app.commands.execute(CommandIDs.openJob, { jobId });
    });
    // A cortex widget whose kernel or model is gone shows the picture its output carries; once its run has
    // ended, the output is rewritten with the final picture (cellrecord.ts).
    const sanitizer = new Sanitizer();
    installCellRecords(
      document.body,
      function* () {
        for (const widget of app.shell.widgets('main')) {
          const cells = (widget as unknown as { content?: { widgets?: unknown } }).content?.widgets;
          if (Array.isArray(cells)) {
            yield cells;
          }
        }
      },
      html => sanitizer.sanitize(html),
      {
        source: {
          ended: jobId => {
            const job = model.state.jobs.find(row => row.job_id === jobId);
            return job !== undefined && JOB_TERMINAL.includes(job.status);
          },
          draw: (jobId, continuedIn) =>
            api.request<IDrawnRecord>(
              'GET',
              `record/${encodeURIComponent(jobId)}${continuedIn !== null ? `?continued_in=${continuedIn}` : ''}`
            )
        },
        onJobs: listener => model.onChange(listener)
      }
    );
  }
};

export default plugin;

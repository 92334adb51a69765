/**
 * The cortex-nb JupyterLab extension: a left-sidebar panel (connection, devices, jobs, finished
 * trainings), job and comparison views in the main area, palette commands, and "Open in sidebar" links
 * from notebook outputs.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { CortexApi } from './api';
import { CommandIDs, registerCommands } from './commands';
import { cortexIcon } from './icon';
import { jobLabel, sortJobs } from './jobrows';
import { PanelModel } from './model';
import { installOpenJobListener } from './openlink';
import { PanelRefresher } from './refresher';
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
    const refresher = new PanelRefresher(api, model);
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
      compare: jobIds => void app.commands.execute(CommandIDs.compare, { jobIds })
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
  }
};

export default plugin;

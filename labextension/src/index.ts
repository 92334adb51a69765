/**
 * The cortex-nb JupyterLab extension: a left-sidebar panel (connection, devices, jobs), a job view in
 * the main area, palette commands, and "Open in sidebar" links from notebook outputs.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';

import { CortexApi } from './api';
import { CommandIDs, registerCommands } from './commands';
import { cortexIcon } from './icon';
import { PanelModel, sortJobs } from './model';
import { installOpenJobListener } from './openlink';
import { PanelRefresher } from './refresher';
import { JobView } from './widgets/jobview';
import { CortexSidebar } from './widgets/sidebar';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'cortex-nb:plugin',
  description: 'cortex-nb sidebar: GPUs, jobs, logs and metrics from the cortex-nb backend',
  autoStart: true,
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (app: JupyterFrontEnd, palette: ICommandPalette | null, restorer: ILayoutRestorer | null) => {
    const api = new CortexApi();
    const model = new PanelModel();
    const refresher = new PanelRefresher(api, model);
    const tracker = new WidgetTracker<MainAreaWidget<JobView>>({ namespace: 'cortex-nb-job' });

    const openJob = (jobId: string): void => {
      const open = tracker.find(widget => widget.content.jobId === jobId);
      if (open) {
        app.shell.activateById(open.id);
        return;
      }
      const content = new JobView(api, jobId);
      const widget = new MainAreaWidget({ content });
      widget.id = `cortex-job-view-${jobId}`;
      widget.title.label = content.title.label;
      widget.title.caption = content.title.caption;
      widget.title.icon = cortexIcon;
      void tracker.add(widget);
      app.shell.add(widget, 'main');
      app.shell.activateById(widget.id);
      app.shell.activateById(sidebar.id);
    };

    const sidebar = new CortexSidebar(model, jobId => app.commands.execute(CommandIDs.openJob, { jobId }), () => {
      void app.commands.execute(CommandIDs.refresh);
    });
    sidebar.title.icon = cortexIcon;
    sidebar.title.caption = 'Cortex: GPUs and jobs';
    app.shell.add(sidebar, 'left', { rank: 900 });

    registerCommands(app.commands, {
      refresh: async () => {
        await Promise.all([refresher.refresh(), ...tracker.filter(() => true).map(w => w.content.refreshNow())]);
      },
      openJob,
      showSidebar: () => app.shell.activateById(sidebar.id),
      recentJobIds: () => sortJobs(model.state.jobs).map(job => job.job_id)
    });
    if (palette) {
      for (const command of [CommandIDs.refresh, CommandIDs.openJob]) {
        palette.addItem({ command, category: 'Cortex' });
      }
    }
    if (restorer) {
      restorer.add(sidebar, 'cortex-nb-sidebar');
      void restorer.restore(tracker, {
        command: CommandIDs.openJob,
        args: widget => ({ jobId: widget.content.jobId }),
        name: widget => widget.content.jobId
      });
    }
    installOpenJobListener(document, jobId => {
      void app.commands.execute(CommandIDs.openJob, { jobId });
    });
  }
};

export default plugin;

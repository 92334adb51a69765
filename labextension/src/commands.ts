/** Command ids and the palette commands "Cortex: Refresh" and "Cortex: Open job…". */
import { InputDialog } from '@jupyterlab/apputils';
import { CommandRegistry } from '@lumino/commands';

export namespace CommandIDs {
  export const refresh = 'cortex:refresh';
  export const openJob = 'cortex:open-job';
  export const showSidebar = 'cortex:show-sidebar';
}

export interface ICommandHandlers {
  refresh: () => Promise<void>;
  openJob: (jobId: string) => void;
  showSidebar: () => void;
  /** Job ids to offer in the "Open job…" picker, most relevant first. */
  recentJobIds: () => string[];
}

export function registerCommands(commands: CommandRegistry, handlers: ICommandHandlers): void {
  commands.addCommand(CommandIDs.refresh, {
    label: 'Cortex: Refresh',
    caption: 'Fetch the backend status, devices and jobs now',
    execute: () => handlers.refresh()
  });
  commands.addCommand(CommandIDs.openJob, {
    label: args => (args.jobId ? `Cortex: Open job ${args.jobId}` : 'Cortex: Open job…'),
    caption: 'Open a cortex-nb job: status, logs, metrics, checkpoints and Cancel',
    execute: async args => {
      let jobId = typeof args.jobId === 'string' ? args.jobId : '';
      if (!jobId) {
        const choices = handlers.recentJobIds();
        const answer = await InputDialog.getItem({
          title: 'Open cortex-nb job',
          label: 'Job id',
          items: choices,
          editable: true,
          placeholder: 'job-…'
        });
        jobId = (answer.button.accept && answer.value ? answer.value : '').trim();
      }
      if (jobId) {
        handlers.openJob(jobId);
      }
    }
  });
  commands.addCommand(CommandIDs.showSidebar, {
    label: 'Cortex: Show sidebar',
    execute: () => handlers.showSidebar()
  });
}

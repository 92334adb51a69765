/** Command ids and the palette commands "Cortex: Refresh", "Cortex: Open job…" and "Cortex: Compare trainings". */
import { InputDialog, showErrorMessage } from '@jupyterlab/apputils';
import { CommandRegistry } from '@lumino/commands';

export namespace CommandIDs {
  export const refresh = 'cortex:refresh';
  export const openJob = 'cortex:open-job';
  export const compare = 'cortex:compare';
  export const showSidebar = 'cortex:show-sidebar';
}

/** A job as a picker shows it: its name where it has one, with its id. */
export interface IJobChoice {
  jobId: string;
  label: string;
}

export interface ICommandHandlers {
  refresh: () => Promise<void>;
  openJob: (jobId: string) => void;
  compare: (jobIds: string[]) => void;
  showSidebar: () => void;
  /** Jobs to offer in the "Open job…" picker, most relevant first. */
  recentJobs: () => IJobChoice[];
  /** Finished trainings ticked in the sidebar. */
  compareSelection: () => string[];
}

export function registerCommands(commands: CommandRegistry, handlers: ICommandHandlers): void {
  commands.addCommand(CommandIDs.refresh, {
    label: 'Cortex: Refresh',
    caption: 'Fetch the backend status, devices and jobs now',
    execute: () => handlers.refresh()
  });
  commands.addCommand(CommandIDs.openJob, {
    label: args => (args.jobId ? `Cortex: Open job ${args.label ?? args.jobId}` : 'Cortex: Open job…'),
    caption: 'Open a cortex-nb job: status, progress, loss, logs, metrics, checkpoints',
    execute: async args => {
      let jobId = typeof args.jobId === 'string' ? args.jobId : '';
      if (!jobId) {
        const choices = handlers.recentJobs();
        const answer = await InputDialog.getItem({
          title: 'Open cortex-nb job',
          label: 'Job',
          items: choices.map(choice => choice.label),
          editable: true,
          placeholder: 'name or job-…'
        });
        const typed = (answer.button.accept && answer.value ? answer.value : '').trim();
        jobId = choices.find(choice => choice.label === typed || choice.jobId === typed)?.jobId ?? typed;
      }
      if (jobId) {
        handlers.openJob(jobId);
      }
    }
  });
  commands.addCommand(CommandIDs.compare, {
    label: 'Cortex: Compare trainings',
    caption: 'Overlay the loss curves of the trainings ticked in the Cortex sidebar, with a table of their settings',
    execute: async args => {
      const given = Array.isArray(args.jobIds) ? (args.jobIds as unknown[]).filter((id): id is string => typeof id === 'string') : [];
      const jobIds = given.length ? given : handlers.compareSelection();
      if (jobIds.length < 2) {
        await showErrorMessage('Compare trainings', 'Tick two or more finished trainings in the Cortex sidebar first.');
        return;
      }
      handlers.compare(jobIds);
    }
  });
  commands.addCommand(CommandIDs.showSidebar, {
    label: 'Cortex: Show sidebar',
    execute: () => handlers.showSidebar()
  });
}

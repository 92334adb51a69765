/**
 * What the sidebar's buttons do: insert `%cortex job ID` into the active notebook, rename, tag and delete
 * jobs, open a job's checkpoints, keep one, and delete in bulk. Each asks first where something is lost
 * (a dry run says what would go), and shows the backend's refusal as it is worded (it says what to do).
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Clipboard, Dialog, InputDialog, Notification, showDialog, showErrorMessage } from '@jupyterlab/apputils';

import { CortexApi, CortexApiError } from './api';
import { formatTags, jobLine, parseTags, withInternalLabels } from './joblist';
import { jobTitle } from './jobrows';
import { PanelModel } from './model';
import { PanelRefresher } from './refresher';
import { parseAge, pruneSummary } from './storage';
import { ISidebarActions } from './widgets/sidebar';

type StorageActions = Omit<ISidebarActions, 'openJob' | 'refresh' | 'startLocal' | 'compare'>;

function refusal(error: unknown): string {
  return error instanceof CortexApiError ? `${error.message} (${error.code})` : String(error);
}

/** The notebook the user works in (duck-typed: a main-area widget whose content has an active cell). */
interface INotebookLike {
  activeCell: { model: { sharedModel: { setSource(text: string): void } } } | null;
}

function activeNotebook(app: JupyterFrontEnd): INotebookLike | null {
  const content = (app.shell.currentWidget as unknown as { content?: unknown } | null)?.content;
  return content && typeof content === 'object' && 'activeCell' in content ? (content as INotebookLike) : null;
}

export function sidebarActions(
  app: JupyterFrontEnd,
  api: CortexApi,
  model: PanelModel,
  refresher: PanelRefresher
): StorageActions {
  const job = (jobId: string) => model.state.jobs.find(candidate => candidate.job_id === jobId);
  const name = (jobId: string): string => {
    const found = job(jobId);
    return found ? jobTitle(found) : jobId;
  };

  /** Run a storage action, then show its outcome (or refusal) under the open job and refetch. */
  const storageAction = async (run: () => Promise<string | null>): Promise<void> => {
    try {
      const note = await run();
      if (note !== null) {
        model.update({ storageNote: note });
      }
    } catch (error) {
      model.update({ storageNote: refusal(error) });
    }
    await refresher.refreshStorage();
  };

  const prune = async (jobId: string, olderThanS?: number): Promise<string | null> => {
    const preview = await api.pruneCheckpoints(jobId, { olderThanS, dryRun: true });
    if (!preview.deleted.length) {
      return pruneSummary(preview);
    }
    const answer = await showDialog({
      title: `Delete checkpoints of ${name(jobId)}?`,
      body: pruneSummary(preview),
      buttons: [Dialog.cancelButton({ label: 'Keep them' }), Dialog.warnButton({ label: 'Delete' })]
    });
    if (!answer.button.accept) {
      return null;
    }
    return pruneSummary(await api.pruneCheckpoints(jobId, { olderThanS }));
  };

  return {
    insertJobLine: async jobId => {
      const line = jobLine(jobId);
      const notebook = activeNotebook(app);
      if (!notebook) {
        Clipboard.copyToSystem(line);
        Notification.info(`No notebook is active: "${line}" is copied to the clipboard.`, { autoClose: 5000 });
        return;
      }
      await app.commands.execute('notebook:insert-cell-below');
      notebook.activeCell?.model.sharedModel.setSource(line);
    },
    renameJob: async jobId => {
      const answer = await InputDialog.getText({ title: `Rename ${jobId}`, label: 'Name', text: job(jobId)?.name ?? '' });
      if (!answer.button.accept || answer.value === null || !answer.value.trim()) {
        return;
      }
      try {
        await api.updateJob(jobId, { name: answer.value.trim() });
        await refresher.refresh();
      } catch (error) {
        await showErrorMessage('Rename job', refusal(error));
      }
    },
    tagJob: async jobId => {
      const answer = await InputDialog.getText({
        title: `Tags of ${name(jobId)}`,
        label: 'Tags (key=value or key, separated by commas)',
        text: formatTags(job(jobId)?.labels ?? {})
      });
      if (!answer.button.accept || answer.value === null) {
        return;
      }
      const parsed = parseTags(answer.value);
      if ('error' in parsed) {
        await showErrorMessage('Tag job', parsed.error);
        return;
      }
      try {
        await api.updateJob(jobId, { labels: withInternalLabels(parsed.labels, job(jobId)?.labels ?? {}) });
        await refresher.refresh();
      } catch (error) {
        await showErrorMessage('Tag job', refusal(error));
      }
    },
    deleteJob: async jobId => {
      const answer = await showDialog({
        title: `Delete ${name(jobId)}?`,
        body: `${jobId}, its logs and its checkpoints are deleted for good (a kept checkpoint refuses this).`,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
      });
      if (!answer.button.accept) {
        return;
      }
      try {
        await api.deleteJob(jobId);
        await refresher.refresh();
      } catch (error) {
        await showErrorMessage('Delete job', refusal(error));
      }
    },
    toggleStorageJob: jobId => {
      model.toggleStorageJob(jobId);
      void refresher.refreshStorage();
    },
    keepCheckpoint: (jobId, checkpointId, kept) =>
      void storageAction(async () => {
        await api.keepCheckpoint(jobId, checkpointId, kept);
        return kept ? `${checkpointId} is kept: bulk deletes spare it.` : `${checkpointId} is no longer kept.`;
      }),
    pruneAllButFinal: jobId => void storageAction(() => prune(jobId)),
    pruneOlderThan: jobId =>
      void storageAction(async () => {
        const answer = await InputDialog.getText({
          title: `Delete checkpoints of ${name(jobId)} older than`, label: 'Age (90s, 30m, 12h, 7d)', text: '7d'
        });
        if (!answer.button.accept || answer.value === null) {
          return null;
        }
        const seconds = parseAge(answer.value);
        if (seconds === null) {
          return `"${answer.value}" is not an age: write e.g. 90s, 30m, 12h or 7d.`;
        }
        return prune(jobId, seconds);
      })
  };
}

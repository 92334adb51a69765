/**
 * The small buttons each listed job carries: insert `%cortex job ID` into the active notebook, rename,
 * tag, and (once it has ended) delete. A click acts on that job only, never opens it.
 */
import { h } from '../dom';

export interface IJobRowActions {
  insertJobLine: (jobId: string) => void;
  renameJob: (jobId: string) => void;
  tagJob: (jobId: string) => void;
  deleteJob: (jobId: string) => void;
}

export function rowActions(jobId: string, terminal: boolean, actions: IJobRowActions): HTMLElement {
  const bar = h('div', { class: 'cortex-row-actions' });
  const buttons: Array<[string, string, string, (id: string) => void]> = [
    ['insert', 'Insert', `Insert "%cortex job ${jobId}" into the active notebook`, actions.insertJobLine],
    ['rename', 'Rename', 'Give this job another name', actions.renameJob],
    ['tag', 'Tags', 'Set this job\'s tags (labels)', actions.tagJob]
  ];
  if (terminal) {
    buttons.push(['delete', 'Delete', 'Forget this finished job: its record, logs and checkpoints', actions.deleteJob]);
  }
  for (const [action, label, title, run] of buttons) {
    const button = h('button', { class: 'jp-Button cortex-button cortex-row-action', 'data-action': action, title }, label);
    button.addEventListener('click', event => {
      event.stopPropagation();
      run(jobId);
    });
    button.addEventListener('keydown', event => event.stopPropagation());
    bar.appendChild(button);
  }
  return bar;
}

/** A job's id, start time and tags, one quiet line. */
export function identityLine(jobId: string, start: string, tags: string[]): HTMLElement {
  return h('div', { class: 'cortex-job-identity cortex-muted' },
    h('span', { class: 'cortex-job-id' }, jobId),
    ` · started ${start}`,
    ...tags.map(tag => h('span', { class: 'cortex-tag', 'data-tag': tag }, tag))
  );
}

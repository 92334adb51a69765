/**
 * The sidebar's jobs section: every job still going (and finished jobs that never trained), with its
 * word, why it waits or when it frees its device, training progress, its id, start time and tags, and
 * its actions (insert, rename, tag, delete); a click opens the job view.
 */
import { h, wordBadge } from '../dom';
import { IJobRow } from '../jobrows';
import { IJobRowActions, identityLine, rowActions } from './rowactions';

export function renderJobs(
  rows: IJobRow[],
  openJob: (jobId: string) => void,
  actions: IJobRowActions,
  filtered = false
): HTMLElement {
  const section = h('section', { class: 'cortex-section cortex-jobs' }, h('h3', {}, 'Jobs'));
  if (!rows.length) {
    section.appendChild(h('div', { class: 'cortex-muted' }, filtered ? 'no job matches the filter' : 'no jobs yet'));
  }
  const list = h('ul', { class: 'cortex-job-list' });
  for (const row of rows) {
    const progress = !row.terminal && row.progress.fraction !== null
      ? h('progress', { max: 1, value: row.progress.fraction, 'aria-label': row.progress.label })
      : null;
    const training = [row.progress.loss, row.terminal ? '' : row.progress.timing].filter(Boolean).join(' · ');
    const item = h('li', {
      class: 'cortex-job', 'data-job-id': row.jobId, 'data-word': row.word, tabindex: 0, title: `Open ${row.title} (${row.jobId})`
    },
      h('div', { class: 'cortex-job-head' },
        h('span', { class: 'cortex-job-title' }, row.title),
        wordBadge(row.word)
      ),
      row.detail
        ? h('div', { class: `cortex-job-detail${row.word === 'failed' ? ' cortex-error' : ''}` }, row.detail)
        : null,
      progress,
      training ? h('div', { class: 'cortex-job-training cortex-muted' }, training) : null,
      h('div', { class: 'cortex-job-meta cortex-muted' },
        [row.model, row.device, `${row.age} ago`].filter(Boolean).join(' · ')
      ),
      identityLine(row.jobId, row.start, row.tags),
      rowActions(row.jobId, row.terminal, actions)
    );
    item.addEventListener('click', () => openJob(row.jobId));
    item.addEventListener('keydown', event => {
      if (event.key === 'Enter') {
        openJob(row.jobId);
      }
    });
    list.appendChild(item);
  }
  section.appendChild(list);
  return section;
}

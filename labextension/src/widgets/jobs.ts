/** The sidebar's jobs section: status, progress and age per job; a click opens the job view. */
import { h, statusBadge } from '../dom';
import { IJobRow } from '../model';

export function renderJobs(rows: IJobRow[], openJob: (jobId: string) => void): HTMLElement {
  const section = h('section', { class: 'cortex-section cortex-jobs' }, h('h3', {}, 'Jobs'));
  if (!rows.length) {
    section.appendChild(h('div', { class: 'cortex-muted' }, 'no jobs yet'));
  }
  const list = h('ul', { class: 'cortex-job-list' });
  for (const row of rows) {
    const progress = row.progress.fraction !== null ? h('progress', { max: 1, value: row.progress.fraction }) : null;
    const item = h('li', { class: 'cortex-job', 'data-job-id': row.jobId, tabindex: 0, title: `Open ${row.jobId}` },
      h('div', { class: 'cortex-job-head' },
        h('span', { class: 'cortex-job-title' }, row.title),
        statusBadge(row.status)
      ),
      h('div', { class: 'cortex-job-meta cortex-muted' },
        [row.model, row.device, row.progress.label, `${row.age} ago`].filter(Boolean).join(' · ')
      ),
      progress,
      row.failure ? h('div', { class: 'cortex-error' }, row.failure) : null
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

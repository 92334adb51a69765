/**
 * The sidebar's storage section: a meter per owner against the checkpoint quota, the jobs holding
 * checkpoints (largest first); a click opens a job's checkpoints with their step, bytes, where their
 * weights went and a Keep box, and the bulk actions "Delete all but final" and "Delete older than…".
 */
import { h } from '../dom';
import { ICheckpointRow, IStorageJobRow, IStorageMeter } from '../storage';

export interface IStorageProps {
  meters: IStorageMeter[];
  jobs: IStorageJobRow[];
  openJob: string | null;
  /** The open job's lineage summary ("step 3 · 3 checkpoints · 1.2 MiB"), '' until it arrives. */
  summary: string;
  checkpoints: ICheckpointRow[];
  note: string | null;
  toggleJob: (jobId: string) => void;
  keep: (jobId: string, checkpointId: string, kept: boolean) => void;
  pruneAllButFinal: (jobId: string) => void;
  pruneOlderThan: (jobId: string) => void;
}

export function renderStorage(props: IStorageProps): HTMLElement {
  const section = h('section', { class: 'cortex-section cortex-storage' }, h('h3', {}, 'Checkpoint storage'));
  for (const meter of props.meters) {
    section.appendChild(h('div', { class: 'cortex-storage-meter', 'data-owner': meter.owner },
      meter.fraction !== null
        ? h('progress', { max: 1, value: meter.fraction, 'aria-label': `checkpoint storage of ${meter.owner}` })
        : null,
      h('div', { class: 'cortex-muted cortex-storage-label' }, props.meters.length > 1 ? `${meter.owner}: ${meter.label}` : meter.label)
    ));
  }
  if (!props.jobs.length) {
    section.appendChild(h('div', { class: 'cortex-muted' }, props.meters.length ? 'no checkpoints' : 'storage not available'));
    return section;
  }
  const list = h('ul', { class: 'cortex-job-list cortex-storage-jobs' });
  for (const job of props.jobs) {
    const open = props.openJob === job.jobId;
    const head = h('div', {
      class: 'cortex-job-head cortex-storage-job-head', tabindex: 0, role: 'button', 'aria-expanded': open ? 'true' : 'false',
      title: open ? 'Hide its checkpoints' : 'Show its checkpoints and where they went'
    },
      h('span', { class: 'cortex-job-title' }, job.title),
      h('span', { class: 'cortex-muted cortex-storage-status' }, job.status)
    );
    head.addEventListener('click', () => props.toggleJob(job.jobId));
    head.addEventListener('keydown', event => {
      if (event.key === 'Enter') {
        props.toggleJob(job.jobId);
      }
    });
    const item = h('li', { class: 'cortex-job cortex-storage-job', 'data-storage-job-id': job.jobId },
      head,
      h('div', { class: 'cortex-muted cortex-storage-job-size' }, job.label)
    );
    if (open) {
      item.appendChild(renderCheckpoints(job.jobId, props));
    }
    list.appendChild(item);
  }
  section.appendChild(list);
  return section;
}

function renderCheckpoints(jobId: string, props: IStorageProps): HTMLElement {
  const box = h('div', { class: 'cortex-storage-checkpoints' });
  if (props.summary) {
    box.appendChild(h('div', { class: 'cortex-muted cortex-lineage-summary' }, props.summary));
  }
  const table = h('table', { class: 'cortex-checkpoint-table' },
    h('thead', {}, h('tr', {}, h('th', {}, 'checkpoint'), h('th', {}, 'step'), h('th', {}, 'size'), h('th', {}, 'keep'), h('th', {}, 'went to')))
  );
  const body = h('tbody');
  for (const row of props.checkpoints) {
    const keep = h('input', {
      type: 'checkbox', class: 'cortex-keep', checked: row.kept,
      'aria-label': `keep ${row.checkpointId}`, title: 'Kept checkpoints survive bulk deletes'
    });
    keep.addEventListener('change', () => props.keep(jobId, row.checkpointId, keep.checked));
    body.appendChild(h('tr', { 'data-checkpoint-id': row.checkpointId },
      h('td', {}, row.checkpointId), h('td', {}, String(row.step)), h('td', {}, row.size), h('td', {}, keep),
      h('td', { class: 'cortex-muted' }, row.went)
    ));
  }
  table.appendChild(body);
  box.appendChild(table);
  const allButFinal = h('button', {
    class: 'jp-Button cortex-button cortex-prune-all', title: 'Delete every checkpoint of this job but "final" and the kept ones'
  }, 'Delete all but final');
  allButFinal.addEventListener('click', () => props.pruneAllButFinal(jobId));
  const older = h('button', {
    class: 'jp-Button cortex-button cortex-prune-older', title: 'Delete this job\'s checkpoints older than a duration (not "final", not the kept ones)'
  }, 'Delete older than…');
  older.addEventListener('click', () => props.pruneOlderThan(jobId));
  box.appendChild(h('div', { class: 'cortex-row-actions' }, allButFinal, older));
  if (props.note) {
    box.appendChild(h('div', { class: 'cortex-storage-note' }, props.note));
  }
  return box;
}

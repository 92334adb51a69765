/**
 * What the sidebar shows of checkpoint storage: a meter per owner against the quota, the jobs holding
 * checkpoints (largest first), one job's lineage (each checkpoint's step, bytes, keep mark, and where its
 * weights went), and what a bulk delete did. Bytes are written by the one formatter (`formatBytes`).
 * Pure: no JupyterLab imports, unit-tested with jest.
 */
import { formatBytes } from './format';
import { IJobLineage, IPrunedCheckpoints, IStorageView } from './types';

export interface IStorageMeter {
  owner: string;
  /** 0..1 of the quota; null without a quota. */
  fraction: number | null;
  /** "1.5 MiB of 50 GiB (0.0%) · 4 checkpoints" */
  label: string;
}

function plural(count: number, word: string): string {
  return `${count} ${word}${count === 1 ? '' : 's'}`;
}

export function storageMeters(view: IStorageView | null): IStorageMeter[] {
  return (view?.owners ?? []).map(owner => {
    const quota = owner.quota_bytes;
    const used = formatBytes(owner.used_bytes);
    const share = quota ? `${used} of ${formatBytes(quota)} (${((100 * owner.used_bytes) / quota).toFixed(1)}%)` : `${used} (no quota)`;
    return {
      owner: owner.owner,
      fraction: quota ? Math.min(1, owner.used_bytes / quota) : null,
      label: `${share} · ${plural(owner.checkpoint_count, 'checkpoint')}`
    };
  });
}

export interface IStorageJobRow {
  jobId: string;
  title: string;
  status: string;
  /** "3 checkpoints · 1 kept · 1.2 MiB" */
  label: string;
  sizeBytes: number;
}

/** The jobs holding checkpoints, largest first (as the backend sends them), every owner's in turn. */
export function storageJobRows(view: IStorageView | null): IStorageJobRow[] {
  return (view?.owners ?? []).flatMap(owner =>
    owner.jobs.map(job => ({
      jobId: job.job_id,
      title: job.name || job.job_id,
      status: job.status,
      label: [plural(job.checkpoint_count, 'checkpoint'), job.kept_count ? `${job.kept_count} kept` : '', formatBytes(job.size_bytes)]
        .filter(Boolean)
        .join(' · '),
      sizeBytes: job.size_bytes
    }))
  );
}

export interface ICheckpointRow {
  checkpointId: string;
  step: number;
  type: string;
  size: string;
  kept: boolean;
  /** Where its weights went: "exported 1× · loaded into job-a · sampled 2×", or '' */
  went: string;
}

export function checkpointRows(lineage: IJobLineage | null): ICheckpointRow[] {
  return (lineage?.checkpoints ?? []).map(checkpoint => {
    const loads = Array.from(new Set(checkpoint.uses.filter(use => use.op === 'load').map(use => use.job_id)));
    const samplings = checkpoint.uses.filter(use => use.op !== 'load').length;
    return {
      checkpointId: checkpoint.checkpoint_id,
      step: checkpoint.step,
      type: checkpoint.type,
      size: formatBytes(checkpoint.size_bytes),
      kept: checkpoint.kept,
      went: [
        checkpoint.exports.length ? `exported ${checkpoint.exports.length}×` : '',
        loads.length ? `loaded into ${loads.join(', ')}` : '',
        samplings ? `sampled ${samplings}×` : ''
      ]
        .filter(Boolean)
        .join(' · ')
    };
  });
}

/** "from base sft final · step 3 · 3 checkpoints · 1.2 MiB · 1 weight sync (last: step 3)": origin first, where known. */
export function lineageSummary(lineage: IJobLineage): string {
  const synced = lineage.weight_syncs.filter(sync => sync.status === 'succeeded');
  const last = synced.length ? synced[synced.length - 1].result?.weight_version : undefined;
  const origin = lineage.origins.length ? lineage.origins[0] : null;
  return [
    origin ? `from ${origin.source_name ?? origin.source_job_id} ${origin.checkpoint_id}${origin.checkpoint_exists ? '' : ' (deleted)'}` : '',
    lineage.step !== null ? `step ${lineage.step}` : '',
    plural(lineage.checkpoints.length, 'checkpoint'),
    formatBytes(lineage.size_bytes),
    synced.length ? `${plural(synced.length, 'weight sync')}${last !== undefined ? ` (last: step ${last})` : ''}` : ''
  ]
    .filter(Boolean)
    .join(' · ');
}

/** What a bulk delete did (or, on a dry run, would do), and what it spared and why. */
export function pruneSummary(reply: IPrunedCheckpoints): string {
  const verb = reply.dry_run ? 'Would delete' : 'Deleted';
  const deleted = reply.deleted.length ? `: ${reply.deleted.join(', ')}` : '';
  const spared = reply.spared.length
    ? `; spared ${reply.spared.map(s => `${s.checkpoint_id} (${s.reason === 'newer' ? 'newer' : s.reason === 'in_use' ? 'in use' : s.reason})`).join(', ')}`
    : '';
  return `${verb} ${plural(reply.deleted.length, 'checkpoint')} (${formatBytes(reply.freed_bytes)})${deleted}${spared}.`;
}

const AGE = /^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$/;
const UNIT_S: Record<string, number> = { '': 1, s: 1, m: 60, h: 3600, d: 86400 };

/** Seconds from "90", "90s", "30m", "12h" or "7d" (as `%cortex checkpoints --older-than` reads them); null otherwise. */
export function parseAge(text: string): number | null {
  const match = AGE.exec(text);
  return match ? parseFloat(match[1]) * UNIT_S[match[2]] : null;
}

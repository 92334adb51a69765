/**
 * Which jobs the sidebar lists and how it names them: the filter (by name, id or tag), the short-lived jobs
 * `%cortex compare` and sampling on demand start (hidden unless asked for), tags as text and back, each
 * job's start time, and the line that shows a job in a notebook cell.
 * Pure: no JupyterLab imports, unit-tested with jest.
 */
import { INTERNAL_LABELS, LABEL_KEY_PATTERN, PURPOSE_LABEL, SHORT_LIVED_PURPOSES } from './contract';
import { IJobView } from './types';

export interface IJobFilter {
  /** Matches a job's name, id or any of its tags (`key`, `value` or `key=value`), case-insensitively. */
  text: string;
  /** Also list the short-lived jobs compare and sampling on demand start. */
  showShortLived: boolean;
}

export const DEFAULT_FILTER: IJobFilter = { text: '', showShortLived: false };

type Labelled = Pick<IJobView, 'labels'>;

/** A job `%cortex compare` or sampling on demand started for itself (its `purpose` label says which). */
export function isShortLived(job: Labelled): boolean {
  return SHORT_LIVED_PURPOSES.includes(job.labels?.[PURPOSE_LABEL] ?? '');
}

/** A job's labels as tags: `key=value`, or `key` alone for an empty value, sorted by key; the labels the
 * tool keeps for itself (INTERNAL_LABELS) are not tags. */
export function jobTags(job: Labelled): string[] {
  return Object.keys(job.labels ?? {})
    .filter(key => !INTERNAL_LABELS.includes(key))
    .sort()
    .map(key => (job.labels[key] ? `${key}=${job.labels[key]}` : key));
}

export function matchesFilter(job: Pick<IJobView, 'job_id' | 'name' | 'labels'>, filter: IJobFilter): boolean {
  if (!filter.showShortLived && isShortLived(job)) {
    return false;
  }
  const wanted = filter.text.trim().toLowerCase();
  if (!wanted) {
    return true;
  }
  const haystack = [job.job_id, job.name ?? '', ...jobTags(job), ...Object.values(job.labels ?? {})];
  return haystack.some(text => text.toLowerCase().includes(wanted));
}

export function filterJobs<T extends Pick<IJobView, 'job_id' | 'name' | 'labels'>>(jobs: T[], filter: IJobFilter): T[] {
  return jobs.filter(job => matchesFilter(job, filter));
}

/** How many short-lived jobs the filter hides (the sidebar says so, with a way to show them). */
export function hiddenShortLived(jobs: Labelled[], filter: IJobFilter): number {
  return filter.showShortLived ? 0 : jobs.filter(isShortLived).length;
}

/** Tags typed as `key=value, key2` (commas or spaces between) as labels, or why they cannot be. */
export function parseTags(text: string): { labels: Record<string, string> } | { error: string } {
  const labels: Record<string, string> = {};
  for (const part of text.split(/[,\s]+/).filter(Boolean)) {
    const at = part.indexOf('=');
    const key = at < 0 ? part : part.slice(0, at);
    const value = at < 0 ? '' : part.slice(at + 1);
    if (!LABEL_KEY_PATTERN.test(key)) {
      return { error: `"${key}" is not a tag name: use lower-case letters, digits, '_', '.' or '-', starting with a letter` };
    }
    if (value.length > 200) {
      return { error: `the value of "${key}" is longer than 200 characters` };
    }
    labels[key] = value;
  }
  return { labels };
}

/** The labels to save for edited tags: the tags given, and the labels the tool keeps for itself as they were. */
export function withInternalLabels(tags: Record<string, string>, current: Record<string, string>): Record<string, string> {
  const kept = Object.fromEntries(Object.entries(current).filter(([key]) => INTERNAL_LABELS.includes(key)));
  return { ...tags, ...kept };
}

/** Labels as the tag dialog shows them (what `parseTags` reads back). */
export function formatTags(labels: Record<string, string>): string {
  return jobTags({ labels }).join(', ');
}

/** When a job started (or, while it waits, was created), as "2026-12-02 11:38" in local time. */
export function formatStart(job: Pick<IJobView, 'created_at' | 'started_at'>): string {
  const when = new Date((job.started_at ?? job.created_at) * 1000);
  const pad = (value: number): string => String(value).padStart(2, '0');
  return `${when.getFullYear()}-${pad(when.getMonth() + 1)}-${pad(when.getDate())} ${pad(when.getHours())}:${pad(when.getMinutes())}`;
}

/** The line a notebook cell runs to show the job (its live widget, or its record once it ended). */
export function jobLine(jobId: string): string {
  return `%cortex job ${jobId}`;
}

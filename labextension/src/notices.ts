/**
 * What the bell tells this user about their runs: a training that ended (done, stopped, cancelled), failed,
 * or started waiting for a device. Read from two successive job lists of the sidebar's poll (the backend
 * shows a token its own jobs), so nothing is said about jobs as they were before the page opened.
 * Pure: no JupyterLab imports, unit-tested with jest; index.ts emits them with Notification.emit.
 */
import { displayState } from './contract';
import { isTerminal, jobTitle } from './jobrows';
import { IJobView } from './types';

export interface IRunNotice {
  jobId: string;
  /** JupyterLab's notification types: 'success' (ended as planned), 'error', 'warning', 'info'. */
  type: 'success' | 'error' | 'warning' | 'info';
  message: string;
}

/** The notices for what changed between `before` (null on the first round: nothing to compare) and `now`. */
export function runNotices(before: IJobView[] | null, now: IJobView[], nowS: number = Date.now() / 1000): IRunNotice[] {
  if (before === null) {
    return [];
  }
  const previous = new Map(before.map(job => [job.job_id, job]));
  const notices: IRunNotice[] = [];
  for (const job of now) {
    const was = previous.get(job.job_id);
    const [word, detail] = displayState(job, nowS);
    const title = jobTitle(job);
    if (was && !isTerminal(was.status) && isTerminal(job.status)) {
      if (job.status === 'failed') {
        notices.push({ jobId: job.job_id, type: 'error', message: `${title} failed: ${detail ?? 'no reason given'}` });
      } else {
        const how = detail ? `${word} ${detail}` : word;
        notices.push({ jobId: job.job_id, type: word === 'done' ? 'success' : 'info', message: `${title} ${how}` });
      }
    } else if (job.status === 'pending' && job.queue?.reason && (!was || was.status !== 'pending')) {
      notices.push({ jobId: job.job_id, type: 'warning', message: `${title} waits: ${detail ?? job.queue.reason}` });
    }
  }
  return notices;
}

/** What the bell says between two rounds of the sidebar's job list. */
import { runNotices } from '../src/notices';
import { job, progress } from './jobs';

describe('runNotices', () => {
  it('says nothing on the first round: jobs as they were before the page opened are not news', () => {
    expect(runNotices(null, [job({ status: 'failed', failure_code: 'worker_crashed' })])).toEqual([]);
  });

  it('tells a run that ended, as the sidebar words it', () => {
    const running = job({ name: 'lighthouse', progress: progress() });
    const done = job({ name: 'lighthouse', status: 'done', progress: progress({ phase: 'finished', step: 80 }) });
    expect(runNotices([running], [done])).toEqual([{ jobId: 'job-1', type: 'success', message: 'lighthouse done' }]);
    const stopped = job({
      name: 'lighthouse',
      status: 'done',
      progress: progress({ phase: 'stopped', step: 31, last_checkpoint: 'final' })
    });
    expect(runNotices([running], [stopped])).toEqual([
      { jobId: 'job-1', type: 'info', message: 'lighthouse stopped at 31/80 (checkpoint final)' }
    ]);
    expect(runNotices([done], [done])).toEqual([]); // said once
  });

  it('tells a failure with its reason, and a run that starts waiting with why', () => {
    const running = job({ progress: progress() });
    const failed = job({ status: 'failed', failure_code: 'worker_crashed', failure_message: 'the worker died' });
    expect(runNotices([running], [failed])).toEqual([
      { jobId: 'job-1', type: 'error', message: 'job-1 failed: worker_crashed: the worker died' }
    ]);
    const queued = job({
      job_id: 'job-2',
      status: 'pending',
      queue: { position: 1, reason: 'waiting for a cpu slot', estimate_s: null }
    } as never);
    expect(runNotices([running], [running, queued])).toEqual([
      { jobId: 'job-2', type: 'warning', message: 'job-2 waits: #1 in the queue: waiting for a cpu slot' }
    ]);
    expect(runNotices([queued], [queued])).toEqual([]);
  });
});

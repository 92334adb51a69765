import {
  DEFAULT_FILTER, filterJobs, formatStart, formatTags, hiddenShortLived, isShortLived, jobLine, jobTags, parseTags,
  withInternalLabels
} from '../src/joblist';
import { jobRow } from '../src/jobrows';
import { PanelModel } from '../src/model';
import { job, progress } from './jobs';

const compareJob = job({ job_id: 'job-c', name: '%cortex compare', labels: { purpose: 'compare' } });
const sampleJob = job({ job_id: 'job-s', name: 'sample job-a', labels: { purpose: 'sample' } });
const tagged = job({ job_id: 'job-a', name: 'lamps sft', labels: { dataset: 'lamps', try: '2', draft: '' } });
const plain = job({ job_id: 'job-b', name: 'baseline' });

describe('the job filter', () => {
  it('hides the short-lived jobs compare and sampling on demand start, unless asked', () => {
    const jobs = [compareJob, sampleJob, tagged, plain];
    expect(isShortLived(compareJob) && isShortLived(sampleJob)).toBe(true);
    expect(isShortLived(job({ labels: { purpose: 'research' } }))).toBe(false);
    expect(filterJobs(jobs, DEFAULT_FILTER).map(j => j.job_id)).toEqual(['job-a', 'job-b']);
    expect(hiddenShortLived(jobs, DEFAULT_FILTER)).toBe(2);
    const all = { ...DEFAULT_FILTER, showShortLived: true };
    expect(filterJobs(jobs, all).map(j => j.job_id)).toEqual(['job-c', 'job-s', 'job-a', 'job-b']);
    expect(hiddenShortLived(jobs, all)).toBe(0);
  });

  it('matches name, id or tag, ignoring case', () => {
    const jobs = [tagged, plain];
    const ids = (text: string) => filterJobs(jobs, { ...DEFAULT_FILTER, text }).map(j => j.job_id);
    expect(ids('LAMPS')).toEqual(['job-a']);
    expect(ids('try=2')).toEqual(['job-a']);
    expect(ids('draft')).toEqual(['job-a']);
    expect(ids('job-b')).toEqual(['job-b']);
    expect(ids('  ')).toEqual(['job-a', 'job-b']);
    expect(ids('nothing')).toEqual([]);
  });

  it('applies to the sidebar lists through the model', () => {
    const model = new PanelModel();
    const trained = job({ job_id: 'job-t', name: 'trained', status: 'done', progress: progress({ phase: 'finished', step: 80 }) });
    model.update({ jobs: [compareJob, plain, trained] });
    expect(model.jobRows(2000).map(row => row.jobId)).toEqual(['job-b']);
    expect(model.finishedTrainings(2000).map(t => t.jobId)).toEqual(['job-t']);
    expect(model.hiddenShortLived).toBe(1);
    model.setFilter({ text: 'trained' });
    expect(model.jobRows(2000)).toEqual([]);
    expect(model.finishedTrainings(2000).map(t => t.jobId)).toEqual(['job-t']);
    model.setFilter({ text: '', showShortLived: true });
    expect(model.jobRows(2000).map(row => row.jobId).sort()).toEqual(['job-b', 'job-c']);
  });
});

describe('tags', () => {
  it('are shown sorted, key=value or the key alone', () => {
    expect(jobTags(tagged)).toEqual(['dataset=lamps', 'draft', 'try=2']);
    expect(formatTags(tagged.labels)).toBe('dataset=lamps, draft, try=2');
  });

  it('leave out the labels the tool keeps for itself, and editing them keeps those', () => {
    const recorded = { labels: { ...tagged.labels, cell_display: '960e612f71c5cce3' } };
    expect(jobTags(recorded)).toEqual(['dataset=lamps', 'draft', 'try=2']);
    expect(formatTags(recorded.labels)).toBe('dataset=lamps, draft, try=2');
    expect(withInternalLabels({ lamp: 'on' }, recorded.labels)).toEqual({ lamp: 'on', cell_display: '960e612f71c5cce3' });
    expect(withInternalLabels({ lamp: 'on' }, tagged.labels)).toEqual({ lamp: 'on' });
  });

  it('read back what they show, and refuse names the backend refuses', () => {
    expect(parseTags(formatTags(tagged.labels))).toEqual({ labels: tagged.labels });
    expect(parseTags('a=1 b')).toEqual({ labels: { a: '1', b: '' } });
    expect(parseTags('')).toEqual({ labels: {} });
    const refused = parseTags('Dataset=x');
    expect('error' in refused && refused.error).toContain('"Dataset" is not a tag name');
    expect('error' in parseTags(`k=${'v'.repeat(201)}`)).toBe(true);
  });
});

describe('each listed job', () => {
  it('shows its id, start time and tags', () => {
    const started = job({ ...tagged, created_at: 1764667080, started_at: 1764667140 });
    const row = jobRow(started, 1764667200);
    const when = new Date(1764667140 * 1000);
    const pad = (n: number) => String(n).padStart(2, '0');
    expect(row.start).toBe(
      `${when.getFullYear()}-${pad(when.getMonth() + 1)}-${pad(when.getDate())} ${pad(when.getHours())}:${pad(when.getMinutes())}`
    );
    expect(row.tags).toEqual(['dataset=lamps', 'draft', 'try=2']);
    // A job still waiting shows when it was created.
    expect(formatStart({ created_at: 1764667080, started_at: null })).not.toBe(row.start);
  });

  it('inserts the line that shows it in a cell', () => {
    expect(jobLine('job-1a2b')).toBe('%cortex job job-1a2b');
  });
});

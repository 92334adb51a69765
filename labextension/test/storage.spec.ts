import { PanelModel } from '../src/model';
import { checkpointRows, lineageSummary, parseAge, pruneSummary, storageJobRows, storageMeters } from '../src/storage';
import { IJobLineage, IStorageView } from '../src/types';

const MiB = 1024 * 1024;

const storage: IStorageView = {
  owners: [
    {
      owner: 'alice', used_bytes: 3 * MiB, quota_bytes: 100 * MiB, checkpoint_count: 4,
      jobs: [
        { job_id: 'job-a', name: 'lamps sft', status: 'done', checkpoint_count: 3, kept_count: 1, size_bytes: 2.5 * MiB },
        { job_id: 'job-b', name: null, status: 'cancelled', checkpoint_count: 1, kept_count: 0, size_bytes: 0.5 * MiB }
      ]
    }
  ]
};

const lineage: IJobLineage = {
  job_id: 'job-a', name: 'lamps sft', status: 'done', step: 3, size_bytes: 2.5 * MiB,
  checkpoints: [
    { checkpoint_id: 'step-1', step: 1, type: 'resumable', size_bytes: MiB, kept: true, created_at: 10,
      exports: [{ at: 11, contents: 'adapter' }], uses: [] },
    { checkpoint_id: 'final', step: 3, type: 'resumable', size_bytes: 1.5 * MiB, kept: false, created_at: 30, exports: [],
      uses: [
        { job_id: 'job-s', sub_job_id: 'sampling-0', request_id: 'r1', op: 'load', status: 'succeeded', at: 40 },
        { job_id: 'job-s', sub_job_id: 'sampling-0', request_id: 'r2', op: 'load', status: 'succeeded', at: 41 },
        { job_id: 'job-a', sub_job_id: 'sampling-0', request_id: 'r3', op: 'generate', status: 'succeeded', at: 42 }
      ] }
  ],
  weight_syncs: [
    { request_id: 'w1', at: 20, status: 'succeeded', targets: ['sampling-0'], format: 'lora', result: { weight_version: 2 } },
    { request_id: 'w2', at: 35, status: 'failed', targets: ['sampling-0'], format: 'lora', result: null }
  ],
  origins: []
};

describe('the storage meter', () => {
  it('shows bytes used against the quota with the one byte formatter', () => {
    expect(storageMeters(storage)).toEqual([
      { owner: 'alice', fraction: 0.03, label: '3.0 MiB of 100 MiB (3.0%) · 4 checkpoints' }
    ]);
  });

  it('says when there is no quota, and is empty before the first fetch', () => {
    const free = { owners: [{ ...storage.owners[0], quota_bytes: null, checkpoint_count: 1 }] };
    expect(storageMeters(free)).toEqual([{ owner: 'alice', fraction: null, label: '3.0 MiB (no quota) · 1 checkpoint' }]);
    expect(storageMeters(null)).toEqual([]);
  });

  it('lists the jobs holding checkpoints, largest first, named where they have a name', () => {
    expect(storageJobRows(storage)).toEqual([
      { jobId: 'job-a', title: 'lamps sft', status: 'done', label: '3 checkpoints · 1 kept · 2.5 MiB', sizeBytes: 2.5 * MiB },
      { jobId: 'job-b', title: 'job-b', status: 'cancelled', label: '1 checkpoint · 512 KiB', sizeBytes: 0.5 * MiB }
    ]);
  });
});

describe('a job\'s lineage', () => {
  it('follows each checkpoint to its exports, loads and samplings', () => {
    expect(checkpointRows(lineage)).toEqual([
      { checkpointId: 'step-1', step: 1, type: 'resumable', size: '1.0 MiB', kept: true, went: 'exported 1×' },
      { checkpointId: 'final', step: 3, type: 'resumable', size: '1.5 MiB', kept: false, went: 'loaded into job-s · sampled 1×' }
    ]);
  });

  it('sums up the job: its step, checkpoints, bytes and the weight syncs that succeeded', () => {
    expect(lineageSummary(lineage)).toBe('step 3 · 2 checkpoints · 2.5 MiB · 1 weight sync (last: step 2)');
    expect(lineageSummary({ ...lineage, step: null, weight_syncs: [], checkpoints: [] })).toBe('0 checkpoints · 2.5 MiB');
  });

  it('says where the job\'s weights came from, nearest origin first, and when that checkpoint is gone', () => {
    const origin = {
      via: 'init_from' as const, job_id: 'job-a', source_job_id: 'job-base', source_name: 'base sft', checkpoint_id: 'final',
      step: 9, checkpoint_exists: true, request_id: null, sub_job_id: null, at: 5, exports: []
    };
    const farther = { ...origin, job_id: 'job-base', source_job_id: 'job-root', source_name: null };
    expect(lineageSummary({ ...lineage, origins: [origin, farther] })).toBe(
      'from base sft final · step 3 · 2 checkpoints · 2.5 MiB · 1 weight sync (last: step 2)'
    );
    expect(lineageSummary({ ...lineage, weight_syncs: [], origins: [{ ...origin, source_name: null, checkpoint_exists: false }] }))
      .toBe('from job-base final (deleted) · step 3 · 2 checkpoints · 2.5 MiB');
  });

  it('shows only the open job\'s checkpoints in the model', () => {
    const model = new PanelModel();
    model.update({ storage, lineage });
    expect(model.storageCheckpoints()).toEqual([]);
    model.toggleStorageJob('job-a');
    expect(model.state.lineage).toBeNull();  // a fresh fetch for the opened job
    model.update({ lineage });
    expect(model.storageCheckpoints().map(row => row.checkpointId)).toEqual(['step-1', 'final']);
    model.toggleStorageJob('job-a');
    expect(model.state.storageJob).toBeNull();
    expect(model.storageCheckpoints()).toEqual([]);
  });
});

describe('bulk deletes', () => {
  it('say what went, what was spared and why', () => {
    expect(pruneSummary({
      job_id: 'job-a', dry_run: true, deleted: ['step-2'], freed_bytes: MiB,
      spared: [{ checkpoint_id: 'step-1', reason: 'kept' }, { checkpoint_id: 'final', reason: 'final' }, { checkpoint_id: 'step-3', reason: 'in_use' }]
    })).toBe('Would delete 1 checkpoint (1.0 MiB): step-2; spared step-1 (kept), final (final), step-3 (in use).');
    expect(pruneSummary({ job_id: 'job-a', dry_run: false, deleted: [], freed_bytes: 0, spared: [] })).toBe('Deleted 0 checkpoints (0 B).');
  });

  it('read ages as %cortex checkpoints --older-than does', () => {
    expect([parseAge('90'), parseAge('90s'), parseAge('30m'), parseAge('12h'), parseAge('7d'), parseAge('1.5h')]).toEqual([
      90, 90, 1800, 43200, 604800, 5400
    ]);
    expect(parseAge('soon')).toBeNull();
    expect(parseAge('7w')).toBeNull();
  });
});

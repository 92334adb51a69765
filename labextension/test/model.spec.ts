import { API_VERSION, JOB_STATES, PACKAGE_VERSION } from '../src/contract';
import {
  LogBuffer,
  MetricSeries,
  PanelModel,
  connectionState,
  deviceRows,
  formatAge,
  hostLines,
  formatBytes,
  jobProgress,
  jobRow,
  requestIdOf,
  sortJobs,
  versionWarnings
} from '../src/model';
import { ICapacity, IJob, ILogLine, IMetricSample, IStatus } from '../src/types';

function status(overrides: Partial<IStatus> = {}): IStatus {
  return {
    backend_url: 'http://127.0.0.1:8765',
    extension: { version: PACKAGE_VERSION, api_version: API_VERSION },
    backend: { service: 'cortex-nb-backend', version: PACKAGE_VERSION, api_version: API_VERSION },
    reachable: true,
    authenticated: true,
    identity: { owner: 'admin', scopes: ['admin'] },
    versions_match: true,
    api_compatible: true,
    error: null,
    ...overrides
  };
}

function job(overrides: Partial<IJob> = {}): IJob {
  return {
    job_id: 'job-1',
    owner: 'admin',
    name: null,
    experiment: null,
    status: 'running',
    failure_code: null,
    failure_message: null,
    created_at: 1000,
    started_at: 1001,
    finished_at: null,
    sub_jobs: [
      { sub_job_id: 'training-0', type: 'training', status: 'running', base_model: 'tiny', device: 'cpu',
        failure_code: null, failure_message: null }
    ],
    ...overrides
  };
}

const CPU_CAPACITY: ICapacity = {
  devices: [{ id: 'cpu', kind: 'cpu', index: null, name: 'CPU', memory_bytes: null, slots: 8, slots_in_use: 1, slots_available: 7 }],
  slots_total: 8,
  slots_in_use: 1,
  slots_available: 7,
  pending: 0
};

const GPU_CAPACITY: ICapacity = {
  devices: [
    { id: 'cuda:0', kind: 'cuda', index: 0, name: 'NVIDIA H200', memory_bytes: 140 * 2 ** 30, slots: 4, slots_in_use: 2, slots_available: 2, sampler: 'vllm' },
    { id: 'cuda:1', kind: 'cuda', index: 1, name: 'NVIDIA H200', memory_bytes: 140 * 2 ** 30, slots: 4, slots_in_use: 0, slots_available: 4, sampler: 'vllm' }
  ],
  slots_total: 8,
  slots_in_use: 2,
  slots_available: 6,
  pending: 0
};

describe('versions', () => {
  it('says nothing when panel, extension and backend agree', () => {
    expect(versionWarnings(status())).toEqual([]);
    expect(versionWarnings(null)).toEqual([]);
  });

  it('warns when the panel and the server extension differ', () => {
    const warnings = versionWarnings(status({ extension: { version: '0.0.9', api_version: API_VERSION } }));
    expect(warnings.some(w => w.includes(`panel is version ${PACKAGE_VERSION}`) && w.includes('0.0.9'))).toBe(true);
  });

  it('warns when the backend runs another release, and louder on another API major', () => {
    const minor = versionWarnings(status({ backend: { version: '0.2.0', api_version: '1.3' } }));
    expect(minor).toHaveLength(1);
    expect(minor[0]).toContain('0.2.0');
    const major = versionWarnings(status({ backend: { version: '2.0.0', api_version: '2.0' } }));
    expect(major).toHaveLength(2);
    expect(major[1]).toContain('API 2.0');
  });

  it('does not compare versions of a backend it cannot reach', () => {
    expect(versionWarnings(status({ reachable: false, backend: null }))).toEqual([]);
  });
});

describe('connection state', () => {
  it('follows the status report', () => {
    expect(connectionState(null, null)).toBe('unknown');
    expect(connectionState(status(), null)).toBe('connected');
    expect(connectionState(status({ authenticated: false }), null)).toBe('unauthenticated');
    expect(connectionState(status({ reachable: false }), null)).toBe('unreachable');
    expect(connectionState(status(), 'extension_missing: ...')).toBe('error');
  });
});

describe('formatting', () => {
  it('formats ages', () => {
    expect(formatAge(100, 112.9)).toBe('12s');
    expect(formatAge(0, 300)).toBe('5m');
    expect(formatAge(0, 3 * 3600 + 5)).toBe('3h');
    expect(formatAge(0, 2 * 86400)).toBe('2d');
    expect(formatAge(100, 50)).toBe('0s');
  });

  it('formats bytes in binary units', () => {
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1536)).toBe('1.5 KiB');
    expect(formatBytes(140 * 2 ** 30)).toBe('140 GiB');
    expect(formatBytes(null)).toBe('–');
  });
});

describe('jobs', () => {
  it('lists active jobs first, newest first within each group', () => {
    const jobs = [
      job({ job_id: 'old-done', status: 'done', created_at: 50 }),
      job({ job_id: 'new-done', status: 'cancelled', created_at: 300 }),
      job({ job_id: 'old-running', status: 'running', created_at: 10 }),
      job({ job_id: 'new-pending', status: 'pending', created_at: 200 })
    ];
    expect(sortJobs(jobs).map(j => j.job_id)).toEqual(['new-pending', 'old-running', 'new-done', 'old-done']);
  });

  it('knows every job state the backend defines', () => {
    expect(JOB_STATES).toEqual(['pending', 'starting', 'running', 'done', 'failed', 'cancelled']);
    const rows = JOB_STATES.map(state => jobRow(job({ status: state }), 2000));
    expect(rows.filter(row => row.terminal).map(row => row.status)).toEqual(['done', 'failed', 'cancelled']);
  });

  it('builds a row with model, device, age and failure', () => {
    const row = jobRow(job({ status: 'failed', failure_code: 'worker_crashed', failure_message: 'the worker died', name: 'lora-a' }), 1000 + 125);
    expect(row).toMatchObject({ jobId: 'job-1', title: 'lora-a', model: 'tiny', device: 'cpu', age: '2m', terminal: true });
    expect(row.failure).toBe('worker_crashed: the worker died');
  });

  it('takes progress from the backend when it reports a total, else from the last step request', () => {
    expect(jobProgress(job({ progress: { step: 50, total_steps: 200 } }))).toMatchObject({ fraction: 0.25, label: 'step 50/200' });
    const requests = [
      { request_id: 'r3', op: 'step', status: 'failed', created_at: 3, result: null },
      { request_id: 'r2', op: 'step', status: 'succeeded', created_at: 2, result: { step: 7 } },
      { request_id: 'r1', op: 'forward_backward', status: 'succeeded', created_at: 1, result: { loss: 1 } }
    ];
    expect(jobProgress(job(), requests)).toMatchObject({ step: 7, total: null, fraction: null, label: 'step 7' });
    expect(jobProgress(job())).toMatchObject({ step: null, label: '' });
  });
});

describe('request ids', () => {
  it('reads the id from either shape the backend sends', () => {
    expect(requestIdOf({ request_id: 'r1', op: 'step', status: 'succeeded', created_at: 1, result: null })).toBe('r1');
    expect(requestIdOf({ id: 'r2', op: 'step', status: 'succeeded', created_at: 1, result: null })).toBe('r2');
  });
});

describe('devices', () => {
  it('shows GPU utilisation and memory from the newest sample per device', () => {
    const samples: IMetricSample[] = [
      { at: 1, device: 'cuda:0', gpu_utilization_percent: 10, gpu_memory_used_bytes: 2 ** 30, gpu_memory_total_bytes: 140 * 2 ** 30, cpu_percent: 5, ram_used_bytes: 1, ram_total_bytes: 2 },
      { at: 2, device: 'cuda:0', gpu_utilization_percent: 87, gpu_memory_used_bytes: 70 * 2 ** 30, gpu_memory_total_bytes: 140 * 2 ** 30, gpu_temperature_c: 61, gpu_power_watts: 402, cpu_percent: 5, ram_used_bytes: 1, ram_total_bytes: 2 }
    ];
    const [first, second] = deviceRows(GPU_CAPACITY, samples);
    expect(first).toMatchObject({ id: 'cuda:0', utilization: 87, memoryFraction: 0.5, temperatureC: 61, powerW: 402, slotsInUse: 2, sampler: 'vllm' });
    expect(first.utilizationLabel).toBe('GPU 87%');
    expect(first.memoryLabel).toBe('memory 70.0 GiB / 140 GiB');
    // No sample for cuda:1 yet: no bar values, but its memory size from capacity.
    expect(second).toMatchObject({ id: 'cuda:1', utilization: null, memoryFraction: null });
    expect(second.memoryLabel).toBe('memory 140 GiB');
  });

  it('gives a line per host only when the devices span several hosts', () => {
    const host = (name: string, free: number, models?: string[]) => ({
      host: name, devices: [`${name}/cpu`], slots_total: 2, slots_in_use: 2 - free, slots_available: free, models
    });
    expect(hostLines(null)).toEqual([]);
    expect(hostLines({ ...CPU_CAPACITY, hosts: [host('laptop', 2)] })).toEqual([]);
    expect(hostLines({ ...CPU_CAPACITY, hosts: [host('a', 1, ['tiny']), host('gpu-2', 0, ['llama-1b', 'tiny'])] })).toEqual([
      'a: 1/2 slots free · tiny',
      'gpu-2: 0/2 slots free · llama-1b, tiny'
    ]);
  });

  it('shows CPU and RAM on a host without GPU fields (never zeros for absent GPU data)', () => {
    const samples: IMetricSample[] = [{ at: 5, device: null, cpu_percent: 42.4, ram_used_bytes: 6 * 2 ** 30, ram_total_bytes: 24 * 2 ** 30 }];
    const [cpu] = deviceRows(CPU_CAPACITY, samples);
    // a backend from before sampling engines were chosen per device says nothing about them
    expect(cpu).toMatchObject({ utilization: 42.4, memoryFraction: 0.25, temperatureC: null, powerW: null, sampler: null });
    expect(cpu.utilizationLabel).toBe('CPU 42%');
    expect(cpu.memoryLabel).toBe('RAM 6.0 GiB / 24.0 GiB');
  });

  it('is empty before the first capacity report', () => {
    expect(deviceRows(null, [])).toEqual([]);
  });
});

function lines(...seqs: number[]): ILogLine[] {
  return seqs.map(seq => ({ seq, at: seq, sub_job_id: 'training-0', stream: 'stdout', line: `line ${seq}` }));
}

describe('LogBuffer', () => {
  it('keeps lines in order without duplicates across overlapping pages', () => {
    const buffer = new LogBuffer(100);
    expect(buffer.append(lines(1, 2, 3), 3).map(l => l.seq)).toEqual([1, 2, 3]);
    expect(buffer.append(lines(2, 3, 4, 5), 5).map(l => l.seq)).toEqual([4, 5]);
    expect(buffer.lines.map(l => l.seq)).toEqual([1, 2, 3, 4, 5]);
    expect(buffer.cursor).toBe(5);
  });

  it('advances the cursor on an empty page and counts lines the backend dropped', () => {
    const buffer = new LogBuffer(100);
    buffer.append([], 40, 40);
    expect(buffer.cursor).toBe(40);
    expect(buffer.dropped).toBe(40);
  });

  it('keeps only the newest lines beyond its capacity', () => {
    const buffer = new LogBuffer(3);
    buffer.append(lines(1, 2, 3, 4, 5), 5);
    expect(buffer.lines.map(l => l.seq)).toEqual([3, 4, 5]);
    expect(buffer.dropped).toBe(2);
  });
});

describe('MetricSeries', () => {
  it('deduplicates samples, orders them and remembers where to continue', () => {
    const series = new MetricSeries(10);
    series.append([{ at: 2, device: 'cpu', cpu_percent: 20 }, { at: 1, device: 'cpu', cpu_percent: 10 }]);
    series.append([{ at: 2, device: 'cpu', cpu_percent: 20 }, { at: 3, device: 'cpu', cpu_percent: 30 }], 3.5);
    expect(series.points('cpu_percent')).toEqual([[1, 10], [2, 20], [3, 30]]);
    expect(series.since).toBe(3.5);
    expect(series.hasGpu).toBe(false);
  });

  it('detects GPU samples and filters by device', () => {
    const series = new MetricSeries(10);
    series.append([
      { at: 1, device: 'cuda:0', gpu_utilization_percent: 50 },
      { at: 1, device: 'cuda:1', gpu_utilization_percent: 70 }
    ]);
    expect(series.hasGpu).toBe(true);
    expect(series.points('gpu_utilization_percent', 'cuda:1')).toEqual([[1, 70]]);
  });

  it('drops the oldest samples beyond its capacity', () => {
    const series = new MetricSeries(2);
    series.append([1, 2, 3].map(at => ({ at, device: 'cpu', cpu_percent: at })));
    expect(series.points('cpu_percent')).toEqual([[2, 2], [3, 3]]);
  });
});

describe('PanelModel', () => {
  it('notifies listeners on update and stops after unsubscribe', () => {
    const model = new PanelModel();
    const seen: string[] = [];
    const stop = model.onChange(m => seen.push(m.connection));
    model.update({ status: status() });
    stop();
    model.update({ error: 'x' });
    expect(seen).toEqual(['connected']);
    expect(model.connection).toBe('error');
  });

  it('derives rows and the active jobs worth tracking', () => {
    const model = new PanelModel();
    model.update({
      capacity: CPU_CAPACITY,
      jobs: [job({ job_id: 'a', status: 'done' }), job({ job_id: 'b', status: 'running' })],
      requestsByJob: { b: [{ request_id: 'r', op: 'step', status: 'succeeded', created_at: 1, result: { step: 3 } }] }
    });
    expect(model.activeJobIdsOf()).toEqual(['b']);
    const rows = model.jobRows(2000);
    expect(rows.map(r => r.jobId)).toEqual(['b', 'a']);
    expect(rows[0].progress.label).toBe('step 3');
    expect(model.devices()).toHaveLength(1);
  });
});

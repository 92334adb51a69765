import { lossSeries } from '../src/charts/losschart';
import { compareRow, differingColumns } from '../src/compare';
import { job, progress } from './jobs';

function training(jobId: string, name: string, lr: number, finalLoss: number) {
  const record = progress({ phase: 'finished', step: 80, loss_per_token: finalLoss, elapsed_s: 30 });
  return job({
    job_id: jobId, name, status: 'done', progress: record, training_loop: { batch_size: 8, steps: 80, seed: 0 },
    sub_jobs: [{ ...job().sub_jobs[0], optimizer: { lr } }]
  });
}

describe('compare', () => {
  it('puts settings and final figures of each training in a row', () => {
    expect(compareRow(training('job-a', 'lr-3e-3', 0.003, 0.42))).toEqual({
      jobId: 'job-a', title: 'lr-3e-3', model: 'tiny', loraRank: 16, learningRate: 0.003, batchSize: 8, steps: 80, seed: 0,
      finalLoss: 0.42, finalEval: 1.5, durationS: 30, tokensPerS: 2100
    });
  });

  it('names the settings that differ', () => {
    const rows = [training('a', 'a', 0.003, 0.4), training('b', 'b', 0.0003, 0.9)].map(compareRow);
    expect(differingColumns(rows)).toEqual(['learningRate']);
  });

  it('overlays one solid train and one dashed eval curve per training, in its colour', () => {
    const series = lossSeries([
      { label: 'lr-3e-3', progress: training('a', 'lr-3e-3', 0.003, 0.4).progress },
      { label: 'lr-3e-4', progress: training('b', 'lr-3e-4', 0.0003, 0.9).progress }
    ]);
    expect(series.map(s => [s.label, s.className, !!s.dashed])).toEqual([
      ['lr-3e-3', 'cortex-series-1', false], ['lr-3e-3 eval', 'cortex-series-1', true],
      ['lr-3e-4', 'cortex-series-2', false], ['lr-3e-4 eval', 'cortex-series-2', true]
    ]);
    expect(series[0].points).toEqual([[1, 8.6], [42, 1.2345678]]);
  });

  it('labels one job\'s curves train and eval', () => {
    expect(lossSeries([{ label: 'x', progress: progress() }]).map(s => s.label)).toEqual(['train', 'eval']);
  });
});

import { deviceSecondsText, mismatchPoints, mismatchTitle } from '../src/jobfigures';
import { job, progress } from './jobs';

describe('job figures', () => {
  it('says device-seconds used as the cell widget does, and of what budget', () => {
    expect(deviceSecondsText(job({ device_seconds: 1234.4 }))).toBe('1,234 device-s');
    expect(deviceSecondsText(job({ device_seconds: 59.6, progress: progress({ budget_device_s: 600 }) })))
      .toBe('60 device-s of 600 budget');
    expect(deviceSecondsText(job({ device_seconds: null }))).toBeNull();
    expect(deviceSecondsText(job({}))).toBeNull();
  });

  it('charts the sampler-trainer mismatch only where an RL loss reported it', () => {
    expect(mismatchPoints(progress())).toEqual([]);
    expect(mismatchPoints(null)).toEqual([]);
    const record = progress({
      mismatch_history: [
        { step: 1, sampler_mismatch_mean: 0 },
        { step: 2, sampler_mismatch_mean: null },
        { step: 3, sampler_mismatch_mean: 0.0123456 }
      ],
      sampler_mismatch_max: 0.0456789
    });
    expect(mismatchPoints(record)).toEqual([[1, 0], [3, 0.0123456]]);
    expect(mismatchTitle(record)).toBe('sampler ↔ trainer mismatch, mean |Δ logprob| · last max 0.04568');
    expect(mismatchTitle(progress())).toBe('sampler ↔ trainer mismatch, mean |Δ logprob|');
  });
});

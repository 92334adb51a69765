/**
 * The panel's `displayState` (generated into contract.ts) gives the same word and detail as Python's
 * `cortex_nb.states.display_state`, which wrote the expected values into the fixture.
 */
import * as fs from 'fs';
import * as path from 'path';

import {
  DISPLAY_WORDS,
  IDisplayStateJob,
  clock,
  displayState,
  formatBytes,
  formatLoss,
  formatRate,
  progressTiming
} from '../src/contract';
import { IJobView } from '../src/types';

interface ICase {
  job: IDisplayStateJob;
  now: number;
  expected: [string, string | null];
}

const fixture = JSON.parse(fs.readFileSync(path.join(__dirname, 'fixtures', 'display_states.json'), 'utf8')) as {
  cases: ICase[];
};

describe('displayState', () => {
  it('has cases for every word', () => {
    const words = new Set(fixture.cases.map(one => one.expected[0]));
    expect(Array.from(words).sort()).toEqual([...DISPLAY_WORDS].sort());
  });

  it.each(fixture.cases.map(one => [`${one.job.status} -> ${one.expected.join(' · ')}`, one]))(
    'matches Python for %s',
    (_, one) => {
      const { job, now, expected } = one as ICase;
      expect(displayState(job, now)).toEqual(expected);
    }
  );
});

describe('clock', () => {
  it('writes m:ss and h:mm:ss, never negative', () => {
    expect(clock(0)).toBe('0:00');
    expect(clock(272)).toBe('4:32');
    expect(clock(3725)).toBe('1:02:05');
    expect(clock(-5)).toBe('0:00');
  });
});

interface IFormats {
  loss: [number | null, string][];
  rate: [number | null, string][];
  bytes: [number | null, string][];
  timing: [IJobView['progress'], string][];
}

const formats = (fixture as unknown as { formats: IFormats }).formats;

describe('one number, one text: the panel writes the progress record as the widget does', () => {
  it.each(formats.loss)('loss %p -> %p', (value, text) => expect(formatLoss(value)).toBe(text));
  it.each(formats.rate)('rate %p -> %p', (value, text) => expect(formatRate(value, 'tok/s')).toBe(text));
  it.each(formats.bytes)('bytes %p -> %p', (value, text) => expect(formatBytes(value)).toBe(text));
  it.each(formats.timing.map(([record, text]) => [JSON.stringify(record), record, text]))(
    'timing %s',
    (_, record, text) => expect(progressTiming(record as IJobView['progress'])).toBe(text)
  );
});

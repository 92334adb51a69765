/**
 * Which outputs show their picture instead of the widget: cortex widget outputs (widget view + our
 * static picture) whose view cannot show the run.
 */
import {
  RecordRefresher,
  WIDGET_VIEW_MIME,
  brokenWidget,
  pictureIsLive,
  pictureJob,
  pictureOf,
  recordOutput,
  staleRecords
} from '../src/cellrecord';

const picture = '<div class="cortex-job-static" data-cortex-job="job-1">done step 3000/3000</div>';

describe('pictureOf', () => {
  it('finds the picture next to a cortex widget view', () => {
    expect(pictureOf({ [WIDGET_VIEW_MIME]: { model_id: 'abc' }, 'text/html': picture })).toBe(picture);
    expect(pictureOf({ [WIDGET_VIEW_MIME]: {}, 'text/html': ['<div class="cortex-compare-static">', '</div>'] }))
      .toBe('<div class="cortex-compare-static"></div>');
  });

  it('leaves other outputs alone', () => {
    expect(pictureOf({ 'text/html': picture })).toBeNull(); // already a picture: nothing to replace
    expect(pictureOf({ [WIDGET_VIEW_MIME]: {}, 'text/html': '<b>someone else\'s widget</b>' })).toBeNull();
    expect(pictureOf({ [WIDGET_VIEW_MIME]: {}, 'text/plain': 'IntSlider' })).toBeNull();
  });
});

describe('brokenWidget', () => {
  it('is the model-not-found message or a view cut off from its kernel', () => {
    expect(brokenWidget('Error displaying widget: model not found', false)).toBe(true);
    expect(brokenWidget('long-run job-1 · model tiny · training', true)).toBe(true);
    expect(brokenWidget('long-run job-1 · model tiny · training', false)).toBe(false);
    expect(brokenWidget('Loading widget...', false)).toBe(false); // the kernel may still bring the model
  });
});

describe('stale records', () => {
  const live = (jobId: string): string =>
    `<div class="cortex-job-static" data-cortex-job="${jobId}">training step 10/3000` +
    '<div class="cortex-picture-note" style="opacity:.6">picture as of 10:00</div></div>';
  const final = (jobId: string): string =>
    `<div class="cortex-job-static" data-cortex-job="${jobId}">done step 3000/3000</div>`;

  /** A cell whose outputs are these; `cutOff` marks the outputs whose widget showRecords replaced. */
  function cell(
    executionCount: number,
    outputs: Array<{ data: Record<string, unknown>; cutOff?: boolean; trusted?: boolean }>
  ) {
    const models = outputs.map(output => ({ data: output.data, trusted: output.trusted ?? true }));
    const written: Array<[number, unknown]> = [];
    return {
      written,
      model: { executionCount },
      outputArea: {
        model: {
          get length() {
            return models.length;
          },
          get: (index: number) => models[index],
          set: (index: number, output: { data?: Record<string, unknown> }) => {
            written.push([index, output]);
            models[index] = { data: output.data ?? {}, trusted: true };
          }
        },
        widgets: outputs.map(output => ({
          node: { querySelector: (selector: string) => (output.cutOff && selector === '.cortex-cell-record' ? {} : null) }
        })) as unknown as Array<{ node: HTMLElement }>
      }
    };
  }
  const widget = (html: string) => ({ [WIDGET_VIEW_MIME]: { model_id: 'm' }, 'text/html': html });

  it('reads the job and whether the picture was drawn mid-run', () => {
    expect(pictureJob(live('job-1'))).toBe('job-1');
    expect(pictureJob('<div class="cortex-compare-static"></div>')).toBeNull();
    expect(pictureIsLive(live('job-1'))).toBe(true);
    expect(pictureIsLive(final('job-1'))).toBe(false);
  });

  it('finds a cut-off live picture of an ended run, and the cell that took the run over', () => {
    const first = cell(2, [{ data: widget(live('job-1')), cutOff: true }]);
    const reattached = cell(3, [{ data: widget(live('job-1')) }]);
    const bare = cell(4, [{ data: { 'text/html': live('job-2') } }]);
    const ended = (jobId: string) => jobId !== 'job-3';
    const stale = staleRecords([first, reattached, bare], ended);
    expect(stale.map(record => [record.jobId, record.index, record.continuedIn])).toEqual([
      ['job-1', 0, 3],
      ['job-2', 0, null]
    ]);
    // A live widget its kernel still reaches, a final picture, or a run still going: left alone.
    expect(staleRecords([reattached, cell(5, [{ data: { 'text/html': final('job-1') } }])], ended)).toEqual([]);
    expect(staleRecords([cell(6, [{ data: widget(live('job-3')), cutOff: true }])], ended)).toEqual([]);
    // An untrusted output (a notebook from elsewhere naming this user's run): never drawn into.
    expect(staleRecords([cell(8, [{ data: { 'text/html': live('job-1') }, trusted: false }])], ended)).toEqual([]);
  });

  it('rewrites each stale output once with the final drawing, and never with a live one', async () => {
    const first = cell(2, [{ data: widget(live('job-1')), cutOff: true }]);
    const reattached = cell(7, [{ data: widget(final('job-1')) }]);
    const asked: Array<[string, number | null]> = [];
    let finished = false;
    const refresher = new RecordRefresher({
      ended: () => true,
      draw: async (jobId, continuedIn) => {
        asked.push([jobId, continuedIn]);
        return { job_id: jobId, status: finished ? 'done' : 'running', finished, html: 'continued in cell 7', text: 't' };
      }
    });
    refresher.refresh([[first, reattached]]);
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(asked).toEqual([['job-1', 7]]);
    expect(first.written).toEqual([]); // the server still saw it going: nothing written
    finished = true;
    refresher.refresh([[first, reattached]]);
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(first.written).toEqual([
      [0, { output_type: 'display_data', data: { 'text/html': 'continued in cell 7', 'text/plain': 't' }, metadata: {} }]
    ]);
    expect(recordOutput({ job_id: 'j', status: 'done', finished: true, html: 'h', text: 't' }).output_type).toBe('display_data');
    refresher.refresh([[first, reattached]]); // its output is no longer a live picture: not drawn again
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(asked.length).toBe(2);
  });

  it('waits a minute before drawing again after a failed drawing', async () => {
    const first = cell(2, [{ data: { 'text/html': live('job-1') } }]);
    let calls = 0;
    const refresher = new RecordRefresher({
      ended: () => true,
      draw: async () => {
        calls++;
        throw new Error('backend away');
      }
    });
    refresher.refresh([[first]]);
    await new Promise(resolve => setTimeout(resolve, 0));
    refresher.refresh([[first]]);
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(calls).toBe(1);
  });
});

/**
 * Which outputs show their picture instead of the widget: cortex widget outputs (widget view + our
 * static picture) whose view cannot show the run.
 */
import { WIDGET_VIEW_MIME, brokenWidget, pictureOf } from '../src/cellrecord';

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

/**
 * "Open in sidebar" from notebook outputs: the job widget renders an element carrying
 * `data-cortex-open-job="<job_id>"`; a click on it anywhere in the page opens that job's view.
 */
export const OPEN_JOB_ATTRIBUTE = 'data-cortex-open-job';

/** The job id of the nearest element (itself or an ancestor) that asks to open a job, if any. */
export function jobIdFromEvent(target: EventTarget | null): string | null {
  let node = target as Element | null;
  while (node && node.nodeType === 1) {
    const jobId = node.getAttribute(OPEN_JOB_ATTRIBUTE);
    if (jobId) {
      return jobId;
    }
    node = node.parentElement;
  }
  return null;
}

/** Listen on the whole document (outputs are re-rendered freely); returns the function that stops. */
export function installOpenJobListener(doc: Document, openJob: (jobId: string) => void): () => void {
  const listener = (event: Event): void => {
    const jobId = jobIdFromEvent(event.target);
    if (jobId) {
      event.preventDefault();
      openJob(jobId);
    }
  };
  doc.addEventListener('click', listener, true);
  return () => doc.removeEventListener('click', listener, true);
}

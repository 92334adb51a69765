"""The contract between the backend, the kernel-side client, the Jupyter proxy and the sidebar panel.

One definition of each thing that crosses a boundary: the REST routes (`routes`), job and request
states (`states`), error codes (`errors`), the tensor wire format (`wire`), versions (`versions`), the
losses forward_backward accepts (`losses`), the checkpoint format (`checkpoint_format`) and the typed
request and response bodies (`schemas`). The backend, the client, the proxy's allowlist and the panel's
generated TypeScript all read these modules. Nothing here imports torch or httpx, so a worker process
or the proxy can load the contract without the SDK.
"""

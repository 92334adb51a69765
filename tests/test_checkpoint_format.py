"""The checkpoint format (`cortex_nb.protocol.checkpoint_format`), torch-free: which files an export
carries, and the client's check of an export against its manifest."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest

from cortex_nb.checkpoint_files import extract_verified
from cortex_nb.errors import CortexError
from cortex_nb.protocol import checkpoint_format as fmt

FILES = {name: f"bytes of {name}".encode() for name in (*fmt.ADAPTER_FILES, *fmt.RESUMABLE_FILES)}
ROW = {
    "id": "step-3",
    "job_id": "job-1",
    "type": fmt.RESUMABLE,
    "step": 3,
    "base_model": "tiny",
    "manifest": fmt.build_manifest(
        fmt.RESUMABLE,
        3,
        {"base_model": "tiny"},
        "abc",
        {name: fmt.file_entry(data) for name, data in FILES.items()},
    ),
}


def _archive(manifest: dict, members: dict[str, bytes]) -> tuple[io.BytesIO, str]:
    raw = fmt.encode_manifest(manifest)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in {fmt.MANIFEST: raw, **members}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer, hashlib.sha256(raw).hexdigest()


def test_an_adapter_export_carries_the_peft_files_and_all_carries_everything():
    adapter = fmt.export_manifest(ROW, fmt.EXPORT_ADAPTER)
    assert list(adapter["files"]) == sorted(fmt.ADAPTER_FILES)
    assert adapter["checkpoint_id"] == "step-3" and adapter["contents"] == "adapter"
    assert sorted(fmt.export_manifest(ROW, fmt.EXPORT_ALL)["files"]) == sorted(FILES)


def test_the_client_unpacks_an_export_that_matches_its_manifest(tmp_path):
    manifest = fmt.export_manifest(ROW, fmt.EXPORT_ADAPTER)
    archive, digest = _archive(manifest, {name: FILES[name] for name in manifest["files"]})
    assert extract_verified(archive, tmp_path / "out", digest) == manifest
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([fmt.MANIFEST, *fmt.ADAPTER_FILES])


@pytest.mark.parametrize("damage", ["changed file", "unsafe name", "manifest hash"])
def test_the_client_refuses_a_damaged_export_and_leaves_nothing(tmp_path, damage):
    manifest = fmt.export_manifest(ROW, fmt.EXPORT_ADAPTER)
    members = {name: FILES[name] for name in manifest["files"]}
    if damage == "changed file":
        members[fmt.ADAPTER_WEIGHTS] = b"other bytes"
    if damage == "unsafe name":
        members["../escape"] = b"x"
    archive, digest = _archive(manifest, members)
    with pytest.raises(CortexError) as info:
        extract_verified(archive, tmp_path / "out", "0" * 64 if damage == "manifest hash" else digest)
    assert info.value.code == "checkpoint_corrupted"
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []

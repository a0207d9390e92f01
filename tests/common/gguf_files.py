"""Small GGUF files written with the ``gguf`` package, honest or with one lie."""

from __future__ import annotations

from pathlib import Path


def write_gguf(path: Path, arch: str, fields: dict[str, int], tensors: int) -> None:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in fields.items():
        writer.add_uint32(f"{arch}.{key}", value)
    for i in range(tensors):
        writer.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def lying_gguf(folder: Path, lie: str) -> Path:
    """A small valid GGUF file, then one lie: a tensor's data offset past the end of the
    file, two tensors sharing data, or a tensor count one smaller than the file holds."""
    import gguf

    path = folder / "m.gguf"
    write_gguf(path, "llama", {"block_count": 2, "embedding_length": 64}, 3)
    blob = bytearray(path.read_bytes())
    reader = gguf.GGUFReader(path)
    first = reader.tensors[0].field
    at = first.offset + sum(int(p.nbytes) for p in first.parts[:-1])
    if lie == "offset past EOF":
        blob[at : at + 8] = (len(blob) * 2).to_bytes(8, "little")
    elif lie == "overlap":
        second = reader.tensors[1].field
        at2 = second.offset + sum(int(p.nbytes) for p in second.parts[:-1])
        blob[at2 : at2 + 8] = blob[at : at + 8]
    else:  # the header's tensor count, just after the magic and the version
        blob[8:16] = (len(reader.tensors) - 1).to_bytes(8, "little")
    path.write_bytes(bytes(blob))
    return path

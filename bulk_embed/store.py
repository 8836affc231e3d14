"""Where a job's results live until it is done, and the output written from them.

The corpus is cut into windows of `window` rows (window k: ordinals k*window .. (k+1)*window - 1). A finished window
is one part file in the job folder (`OUTPUT.parts/`): `part-000012.parquet` (its rows, by ordinal) beside
`part-000012.rejects.jsonl` (the rows the server refused), each written to a temporary name and renamed, the rejects
first: a part that exists is whole, with its rejects. Killed at any moment, a job started again with the same
arguments finds its finished windows and does only the others, so every row lands exactly once. `job.json` holds the
arguments that decide the windows and the vectors: another job's folder is never resumed.

When every window is done, the output is written from the parts in corpus order, window by window (memory: one
window), to a temporary name, renamed into place, and the job folder is removed.
"""
import glob
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PART = "part-{:06d}"
VALUE_TYPES = {np.dtype("float32"): pa.float32(), np.dtype("float16"): pa.float16(), np.dtype("int8"): pa.int8(),
               np.dtype("uint8"): pa.uint8(), np.dtype("int32"): pa.int32(), np.dtype("int64"): pa.int64()}


class Job:
    def __init__(self, output, settings, restart=False):
        self.output, self.folder = output, output + ".parts"
        self.rejects_path = os.path.splitext(output)[0] + ".rejects.jsonl"
        path = os.path.join(self.folder, "job.json")
        if restart and os.path.isdir(self.folder):
            shutil.rmtree(self.folder)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                found = json.load(handle)
            differ = sorted(k for k in set(found) | set(settings) if found.get(k) != settings.get(k))
            if differ:
                changes = ", ".join(f"{k}: {found.get(k)!r} there, {settings.get(k)!r} now" for k in differ)
                raise SystemExit(f"embed: {self.folder} holds an unfinished job with other settings ({changes}): "
                                 f"run it with those, or add --restart to discard it")
        else:
            os.makedirs(self.folder, exist_ok=True)
            write_atomically(path, json.dumps(settings, indent=1).encode())
        for leftover in glob.glob(os.path.join(self.folder, "*.tmp")):  # a write the kill interrupted
            os.remove(leftover)

    def done_windows(self):
        """{window: rows in its part} of the windows already finished."""
        done = {}
        for path in glob.glob(os.path.join(self.folder, "part-*.parquet")):
            window = int(os.path.basename(path)[5:11])
            done[window] = pq.ParquetFile(path).metadata.num_rows
        return done

    def rejected_count(self):
        total = 0
        for path in glob.glob(os.path.join(self.folder, "part-*.rejects.jsonl")):
            with open(path, "rb") as handle:
                total += sum(1 for _ in handle)
        return total

    def write_window(self, window, rows, rejects):
        """rows: [(ordinal, id, truncated, {column: value})] of one window; rejects: [dict]."""
        base = os.path.join(self.folder, PART.format(window))
        write_atomically(base + ".rejects.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                          for r in sorted(rejects, key=lambda r: r["row"])).encode())
        rows = sorted(rows, key=lambda r: r[0])
        table = part_table(rows)
        write_atomically(base + ".parquet", table, parquet=True)

    def finish(self, output_format):
        """The output from the parts, in corpus order; then the rejects file; then the job folder goes."""
        parts = [path for path in sorted(glob.glob(os.path.join(self.folder, "part-*.parquet")))
                 if pq.ParquetFile(path).metadata.num_rows]  # a window whose every row was refused has no columns
        if output_format == "npy":
            write_npy(self.output, parts)
        else:
            write_parquet(self.output, parts)
        rejects = sorted(glob.glob(os.path.join(self.folder, "part-*.rejects.jsonl")))
        lines = b"".join(read_bytes(path) for path in rejects)
        if lines:
            write_atomically(self.rejects_path, lines)
        elif os.path.exists(self.rejects_path):
            os.remove(self.rejects_path)  # an earlier run's
        shutil.rmtree(self.folder)


def part_table(rows):
    ids = [r[1] for r in rows]
    integers = all(isinstance(i, int) for i in ids)
    columns = {"row": pa.array([r[0] for r in rows], pa.int64()),
               "id": pa.array(ids, pa.int64()) if integers else pa.array([str(i) for i in ids], pa.string())}
    names = list(rows[0][3]) if rows else []
    for name in names:
        columns[name] = nested_array([r[3][name] for r in rows])
    columns["truncated"] = pa.array([bool(r[2]) for r in rows], pa.bool_())
    return pa.table(columns)


def nested_array(values):
    """Per-row numpy vectors (or matrices: ColBERT) as an Arrow list (of lists) column, without a Python loop per
    number."""
    first = np.asarray(values[0])
    value_type = VALUE_TYPES[first.dtype]
    if first.ndim == 1:
        flat = np.concatenate([np.asarray(v).reshape(-1) for v in values]) if values else np.zeros(0, first.dtype)
        offsets = np.cumsum([0] + [len(v) for v in values], dtype=np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, value_type))
    inner = [np.asarray(v) for v in values]
    vectors = nested_array([row for matrix in inner for row in matrix]) if any(len(m) for m in inner) else \
        pa.array([], pa.list_(value_type))
    offsets = np.cumsum([0] + [len(m) for m in inner], dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), vectors)


def read_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


def write_atomically(path, data, parquet=False):
    temporary = path + ".tmp"
    if parquet:
        pq.write_table(data, temporary)
    else:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(temporary, path)


def unify_ids(parts):
    """Integer ids stay integers only if every part has them so; else all are strings."""
    types = {pq.read_schema(path).field("id").type for path in parts}
    return pa.int64() if types <= {pa.int64()} else pa.string()


def write_parquet(output, parts):
    id_type = unify_ids(parts) if parts else pa.string()
    temporary, writer = output + ".tmp", None
    try:
        for path in parts:
            table = pq.read_table(path)
            table = table.set_column(table.schema.get_field_index("id"), "id", table.column("id").cast(id_type))
            table = table.drop(["row"])
            if writer is None:
                writer = pq.ParquetWriter(temporary, table.schema)
            writer.write_table(table)
        if writer is None:  # nothing was embedded: an empty file with the id column
            writer = pq.ParquetWriter(temporary, pa.schema([("id", id_type)]))
    finally:
        if writer is not None:
            writer.close()
    os.replace(temporary, output)


def write_npy(output, parts):
    """One vector column as an .npy matrix (opened as a memory map, filled window by window) and its ids, one JSON
    value per line, in `<output stem>.ids.jsonl`."""
    rows = sum(pq.ParquetFile(path).metadata.num_rows for path in parts)
    vector = next((name for name in pq.read_schema(parts[0]).names if name not in ("row", "id", "truncated")),
                  None) if parts else None
    if vector is None:
        raise SystemExit("embed: nothing was embedded: no .npy to write")
    first = pq.read_table(parts[0], columns=[vector]).column(vector).type.value_type.to_pandas_dtype()
    width = len(pq.read_table(parts[0], columns=[vector]).column(vector)[0])
    temporary, ids_path = output + ".tmp", os.path.splitext(output)[0] + ".ids.jsonl"
    matrix = np.lib.format.open_memmap(temporary, mode="w+", dtype=first, shape=(rows, width))
    at = 0
    with open(ids_path + ".tmp", "w", encoding="utf-8") as ids:
        for path in parts:
            table = pq.read_table(path, columns=["id", vector])
            values = table.column(vector).combine_chunks()
            block = values.flatten().to_numpy(zero_copy_only=False).reshape(len(table), width)
            matrix[at:at + len(table)] = block
            at += len(table)
            ids.writelines(json.dumps(i, ensure_ascii=False) + "\n" for i in table.column("id").to_pylist())
    matrix.flush()
    del matrix
    os.replace(ids_path + ".tmp", ids_path)
    os.replace(temporary, output)

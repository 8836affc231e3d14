"""Where a job's results live until it is done, and the output written from them.

The corpus is cut into windows of `window` rows (window k: ordinals k*window .. (k+1)*window - 1). A finished window
is one part file in the job folder (`OUTPUT.parts/`): `part-000012.parquet` (its rows, by ordinal) beside
`part-000012.rejects.jsonl` (the rows the server refused), each written to a temporary name and renamed, the rejects
first: a part that exists is whole, with its rejects. Killed at any moment, a job started again with the same
arguments finds its finished windows and does only the others, so every row lands exactly once. `job.json` holds the
arguments that decide the windows and the vectors: another job's folder is never resumed.

When every window is done, the output is written from the parts in corpus order, window by window (memory: one
window), to a temporary name, renamed into place, and the job folder is removed.

Ids keep their JSON type, so the integer 6 and the string "6" stay two ids. The `id` column is int64 when every id is
an integer, a string column when every id is a string, and when a corpus mixes them a string column of each id's JSON
text (6 and "6" written as `6` and `"6"`), its field metadata saying so ({"encoding": "json"}). A part holds its own
window's ids the same way; the output's type is decided from all of them. `.ids.jsonl` (.npy output) and the rejects
file are JSON: each id with its type.
"""
import glob
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bulk_embed.ids import DUPLICATE

PART = "part-{:06d}"
JSON_IDS = {b"encoding": b"json"}  # the `id` field's metadata when it holds JSON text
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

    def duplicate_count(self):
        """Rejects of the finished windows that repeat an earlier row's id."""
        total = 0
        for path in glob.glob(os.path.join(self.folder, "part-*.rejects.jsonl")):
            with open(path, "rb") as handle:
                total += sum(json.loads(line)["kind"] == DUPLICATE for line in handle)
        return total

    def window_ids(self, window):
        """[(row, id)] of a finished window's rows that have an id, in corpus order: embedded or rejected (what a
        resumed job's duplicate check must know of the windows it does not read again)."""
        base = os.path.join(self.folder, PART.format(window))
        found = []
        with open(base + ".rejects.jsonl", "rb") as handle:
            found += [(r["row"], r["id"]) for r in map(json.loads, handle) if r["id"] is not None]
        table = pq.read_table(base + ".parquet", columns=["row", "id"])
        found += zip(table.column("row").to_pylist(), ids_of(table))
        return sorted(found, key=lambda pair: pair[0])

    def write_window(self, window, rows, rejects):
        """rows: [(ordinal, id, truncated, {column: value})] of one window; rejects: [dict]."""
        base = os.path.join(self.folder, PART.format(window))
        write_atomically(base + ".rejects.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                          for r in sorted(rejects, key=lambda r: r["row"])).encode())
        rows = sorted(rows, key=lambda r: r[0])
        table = part_table(rows)
        write_atomically(base + ".parquet", table, parquet=True)

    def finish(self, output_format):
        """The output from the parts, in corpus order; then the rejects file; then the job folder goes. Returns the
        id column's kind: "int", "str", "json" (mixed: JSON text) or None (nothing embedded)."""
        parts = [path for path in sorted(glob.glob(os.path.join(self.folder, "part-*.parquet")))
                 if pq.ParquetFile(path).metadata.num_rows]  # a window whose every row was refused has no columns
        id_kind = unify_ids(parts)
        if output_format == "npy":
            write_npy(self.output, parts)
        else:
            write_parquet(self.output, parts, id_kind)
        rejects = sorted(glob.glob(os.path.join(self.folder, "part-*.rejects.jsonl")))
        lines = b"".join(read_bytes(path) for path in rejects)
        if lines:
            write_atomically(self.rejects_path, lines)
        elif os.path.exists(self.rejects_path):
            os.remove(self.rejects_path)  # an earlier run's
        shutil.rmtree(self.folder)
        return id_kind


def part_table(rows):
    ids, id_kind = id_array([r[1] for r in rows])
    columns = {"row": pa.array([r[0] for r in rows], pa.int64()), "id": ids}
    names = list(rows[0][3]) if rows else []
    for name in names:
        columns[name] = nested_array([r[3][name] for r in rows])
    columns["truncated"] = pa.array([bool(r[2]) for r in rows], pa.bool_())
    schema = pa.schema([pa.field(name, array.type, metadata=JSON_IDS if name == "id" and id_kind == "json" else None)
                        for name, array in columns.items()])
    return pa.Table.from_arrays(list(columns.values()), schema=schema)


def id_array(ids):
    """(the ids as a column, its kind): integers as int64 ("int"), strings as strings ("str"), both mixed as each
    one's JSON text ("json")."""
    types = {type(i) for i in ids}
    if types <= {int}:
        return pa.array(ids, pa.int64()), "int"
    if types == {str}:
        return pa.array(ids, pa.string()), "str"
    return pa.array([json.dumps(i, ensure_ascii=False) for i in ids], pa.string()), "json"


def kind_of(schema):
    """"int", "str" or "json": how a part's (or the output's) `id` column holds its ids."""
    field = schema.field("id")
    if pa.types.is_integer(field.type):
        return "int"
    return "json" if (field.metadata or {}).get(b"encoding") == b"json" else "str"


def ids_of(table):
    """A table's ids as Python values, each with its JSON type."""
    values = table.column("id").to_pylist()
    return [json.loads(v) for v in values] if kind_of(table.schema) == "json" else values


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
    """The output's id kind: "int" or "str" when every part's ids are of that type, "json" when they mix (each id
    written as its JSON text: 6 and "6" stay apart), None with no part."""
    kinds = {kind_of(pq.read_schema(path)) for path in parts}
    if not kinds:
        return None
    return kinds.pop() if len(kinds) == 1 else "json"


def id_column(table, id_kind):
    """A part's id column as the output's kind."""
    column, kind = table.column("id"), kind_of(table.schema)
    if kind == id_kind:
        return column
    if kind == "int":  # an integer's JSON is its decimal digits
        return column.cast(pa.string())
    return pa.array([json.dumps(i, ensure_ascii=False) for i in column.to_pylist()], pa.string())


def write_parquet(output, parts, id_kind):
    id_field = pa.field("id", pa.int64() if id_kind == "int" else pa.string(),
                        metadata=JSON_IDS if id_kind == "json" else None)
    temporary, writer = output + ".tmp", None
    try:
        for path in parts:
            table = pq.read_table(path)
            table = table.set_column(table.schema.get_field_index("id"), id_field, id_column(table, id_kind))
            table = table.drop(["row"])
            if writer is None:
                writer = pq.ParquetWriter(temporary, table.schema)
            writer.write_table(table)
        if writer is None:  # nothing was embedded: an empty file with the id column
            writer = pq.ParquetWriter(temporary, pa.schema([id_field]))
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
            ids.writelines(json.dumps(i, ensure_ascii=False) + "\n" for i in ids_of(table))
    matrix.flush()
    del matrix
    os.replace(ids_path + ".tmp", ids_path)
    os.replace(temporary, output)


def read_back(output, output_format, rejects_path):
    """What the finished files hold, read from disk: {"rows", "distinct_ids", "rejects"}. The job checks them
    against the corpus (a lost window, another writer's file, a rejects file of another run would not add up)."""
    from bulk_embed.ids import key

    if output_format == "npy":
        rows = int(np.load(output, mmap_mode="r").shape[0])
        with open(os.path.splitext(output)[0] + ".ids.jsonl", encoding="utf-8") as handle:
            hashes = np.fromiter((key(json.loads(line)) for line in handle), dtype=np.uint64)
    else:
        parquet = pq.ParquetFile(output)
        rows, chunks = parquet.metadata.num_rows, []
        for group in range(parquet.num_row_groups):
            table = parquet.read_row_group(group, columns=["id"])
            chunks.append(np.fromiter((key(i) for i in ids_of(table)), dtype=np.uint64))
        hashes = np.concatenate(chunks) if chunks else np.zeros(0, np.uint64)
    rejects = 0
    if os.path.exists(rejects_path):
        with open(rejects_path, "rb") as handle:
            rejects = sum(1 for _ in handle)
    return {"rows": rows, "distinct_ids": int(len(np.unique(hashes))), "ids": int(len(hashes)), "rejects": rejects}

"""Reading a corpus a row at a time, whatever its size: JSONL, Parquet, CSV / TSV, or plain text (one per line).

Every row comes out as a Row with its ordinal (0-based position in the file, what resuming counts by: the line for
JSONL and text, the row for Parquet, the record for CSV), its id (the id field's value as its JSON type, an integer or
a string; the ordinal for plain text and for `--id-field ''`) and its text as UTF-8 bytes, sent as they are: the
server decides what it refuses (empty, invalid UTF-8, too long). A row that cannot even be read (a JSON line that
does not parse, a missing field) comes out with `problem` set, and goes to the rejects file; its id is None when it
has no usable one of its own. Blank lines (whitespace only) of JSONL and text are no rows at all: skipped, not counted,
their ordinals unused (a text line's id stays its line number).
"""
import csv
import json
import os
from dataclasses import dataclass

FORMATS = ("jsonl", "parquet", "csv", "tsv", "text")
EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet",
              ".csv": "csv", ".tsv": "tsv", ".txt": "text"}
PARQUET_BATCH_ROWS = 4096


@dataclass
class Row:
    ordinal: int
    id: object  # str or int, as the corpus has it; None: the row has no usable id (then problem is set)
    text: bytes | None
    problem: str | None = None  # why the row could not be read (then text is None)


def guess_format(path):
    return EXTENSIONS.get(os.path.splitext(path)[1].lower(), "text")


def rows(path, format, id_field="id", text_field="text", skip=0):
    """The corpus's rows from ordinal `skip` on (rows before it are passed over without being parsed where the
    format allows)."""
    readers = {"jsonl": _jsonl, "parquet": _parquet, "csv": _csv, "tsv": _csv, "text": _text}
    yield from readers[format](path, id_field, text_field, skip, format)


def has_ids(format, id_field):
    """Whether the rows' ids come from the corpus (and may repeat), not from row numbers."""
    return format != "text" and bool(id_field)


def count(path, format):
    """How many rows the corpus holds (None when only reading it all would tell: CSV, whose quoted fields may hold
    newlines). JSONL and text: the lines that are not blank (~10 million lines a second)."""
    if format == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if format in ("csv", "tsv"):
        return None
    with open(path, "rb") as handle:
        return sum(1 for line in handle if not line.isspace())


def _jsonl(path, id_field, text_field, skip, _format):
    with open(path, "rb") as handle:
        for ordinal, line in enumerate(handle):
            if ordinal < skip or line.isspace():  # a blank line is no row
                continue
            try:
                record = json.loads(line)
            except ValueError as error:  # UnicodeDecodeError is a ValueError too
                yield Row(ordinal, None, None, f"line {ordinal + 1} is not a JSON object: {error}")
                continue
            yield _record(ordinal, record, id_field, text_field)


INT64 = (-(1 << 63), (1 << 63) - 1)  # the id column's integers


def _record(ordinal, record, id_field, text_field):
    if not isinstance(record, dict):
        return Row(ordinal, None, None, f"row {ordinal} is not an object with a '{text_field}' field")
    row_id = record.get(id_field, None) if id_field else ordinal
    if row_id is None or isinstance(row_id, (dict, list, float, bool)):
        return Row(ordinal, None, None, f"row {ordinal} has no usable '{id_field}' (a string or an integer): "
                                        f"name another with --id-field, or --id-field '' for row numbers")
    if isinstance(row_id, int) and not INT64[0] <= row_id <= INT64[1]:
        return Row(ordinal, None, None, f"row {ordinal} has an integer '{id_field}' beyond 64 bits: {row_id}")
    if isinstance(row_id, str) and not _encodable(row_id):
        return Row(ordinal, None, None, f"row {ordinal} has a '{id_field}' that is not valid UTF-8")
    text = record.get(text_field)
    if not isinstance(text, str):
        return Row(ordinal, row_id, None, f"'{text_field}' is missing or not a string")
    return Row(ordinal, row_id, _utf8(text))


def _encodable(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON's \ud800, or CSV bytes that are not UTF-8)
        return False
    return True


def _utf8(text):
    # JSON's lone surrogates cannot be UTF-8: kept as surrogatepass bytes, the server refuses them as invalid UTF-8
    return text.encode("utf-8", "surrogatepass")


def _parquet(path, id_field, text_field, skip, _format):
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    columns = [c for c in (id_field, text_field) if c]
    missing = [c for c in columns if c not in source.schema_arrow.names]
    if missing:
        raise SystemExit(f"embed: {path} has no column {', '.join(missing)} (it has: "
                         f"{', '.join(source.schema_arrow.names)}): use --id-field / --text-field")
    ordinal = 0
    for group in range(source.num_row_groups):  # whole row groups before `skip` are not read at all
        size = source.metadata.row_group(group).num_rows
        if ordinal + size <= skip:
            ordinal += size
            continue
        for batch in source.iter_batches(PARQUET_BATCH_ROWS, row_groups=[group], columns=columns):
            ids = batch.column(id_field).to_pylist() if id_field else None
            for k, text in enumerate(batch.column(text_field).to_pylist()):
                if ordinal >= skip:
                    yield _record(ordinal, {id_field: ids[k], text_field: text} if id_field else {text_field: text},
                                  id_field, text_field)
                ordinal += 1


def _csv(path, id_field, text_field, skip, format):
    csv.field_size_limit(1 << 30)  # a passage may be long; the server's byte limit is the one that decides
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t" if format == "tsv" else ",")
        missing = [c for c in (id_field, text_field) if c and c not in (reader.fieldnames or ())]
        if missing:
            raise SystemExit(f"embed: {path} has no column {', '.join(missing)} (it has: "
                             f"{', '.join(reader.fieldnames or ())}): use --id-field / --text-field")
        for ordinal, record in enumerate(reader):
            if ordinal < skip:
                continue
            text = record.get(text_field)
            row = _record(ordinal, record if text is None else {**record, text_field: ""}, id_field, text_field)
            if row.problem is None:  # surrogateescape gives back the file's own bytes, invalid UTF-8 included
                row.text = text.encode("utf-8", "surrogateescape")
            yield row


def _text(path, _id_field, _text_field, skip, _format):
    with open(path, "rb") as handle:
        for ordinal, line in enumerate(handle):
            if ordinal >= skip and not line.isspace():  # a blank line is no row (nor an empty text to refuse)
                yield Row(ordinal, ordinal, line.rstrip(b"\r\n"))

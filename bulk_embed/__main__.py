"""Embed a corpus into a file a vector store loads: `make embed INPUT=corpus.jsonl OUTPUT=vectors.parquet`.

    python -m bulk_embed corpus.jsonl vectors.parquet                 # the default export, KServe gRPC :8001
    python -m bulk_embed passages.parquet out.parquet --model NAME --outputs float,int8 --dimensions 512
    python -m bulk_embed lines.txt vectors.npy                          # an .npy matrix + vectors.ids.jsonl
    python -m bulk_embed requests.jsonl answers.jsonl --http URL        # OpenAI's batch files (batch_file.py)
    API_KEY=... python -m bulk_embed corpus.jsonl out.parquet --http http://host:8080

Killed (kill -9 included) and started again with the same arguments, it goes on where it stopped; rows the server
refuses, rows that cannot be read and rows repeating an earlier row's id are listed with their ids in OUTPUT's
`.rejects.jsonl`; blank lines are skipped. Ids keep their JSON type (6 and "6" are two ids). See bulk_embed/job.py
for how it is fed, bulk_embed/ids.py for repeated ids, bulk_embed/store.py for the id column.
"""
import argparse
import glob
import json
import os
import sys

from bulk_embed import batch_file, corpus, ids, job, lock, store
from bulk_embed.doors import KINDS, QUANTIZED, HttpDoor, JobError, KServeDoor
from local_triton.settings import SERVING_REPOSITORY

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bulk_embed", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", help="the corpus: .jsonl, .parquet, .csv, .tsv, or text (one per line)")
    parser.add_argument("output", help=".parquet (id, embedding, ... per row) or .npy (+ .ids.jsonl)")
    parser.add_argument("--format", choices=corpus.FORMATS, help="the input's format (default: by its extension)")
    parser.add_argument("--id-field", default="id", help="the id's field or column ('': row numbers); default id")
    parser.add_argument("--text-field", default="text", help="the text's field or column; default text")
    parser.add_argument("--duplicates", choices=ids.MODES, default="keep-first",
                        help="a row repeating an earlier row's id: keep-first (default) keeps the first and lists the "
                             "others in the rejects file (duplicate_id); fail refuses the job, before any work")
    parser.add_argument("--model",
                        help="the export: its name, model id or a served name (default: the default export)")
    parser.add_argument("--outputs", default="float",
                        help=f"what to write, comma-separated: {', '.join(KINDS)} (default float)")
    parser.add_argument("--dimensions", type=int, help="a Matryoshka width the export serves")
    parser.add_argument("--prompt-name", help="a prompt of the export (prompts.json), e.g. query / passage")
    parser.add_argument("--input-type", help="Cohere's input_type, mapped to a prompt by the export")
    parser.add_argument("--colbert-pool-factor", type=int, help="compact ColBERT: token pooling factor")
    parser.add_argument("--no-truncate", dest="truncate", action="store_false",
                        help="refuse texts over the model's max length (to the rejects file) instead of cutting them")
    parser.add_argument("--grpc-url", default=f"127.0.0.1:{os.environ.get('GRPC_PORT', '8001')}",
                        help="KServe gRPC of `make serve` (default 127.0.0.1:$GRPC_PORT, 8001)")
    parser.add_argument("--http", metavar="URL", help="go through the HTTP front instead (key: API_KEY)")
    parser.add_argument("--repository", default=SERVING_REPOSITORY,
                        help="the model repository, to find an export by model id or served name (gRPC)")
    parser.add_argument("--in-flight", type=int, help="requests in flight (default: from the server's instances)")
    parser.add_argument("--window", type=int, default=4096,
                        help="rows sorted together (memory bound; resuming needs the same value); default 4096")
    parser.add_argument("--max-wait", type=float, default=600.0,
                        help="seconds one request may spend waiting out overload or a restart before the job stops")
    parser.add_argument("--restart", action="store_true", help="discard an unfinished job's parts and start over")
    args = parser.parse_args(argv)
    args.kinds = [k.strip() for k in args.outputs.split(",") if k.strip()]
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown or not args.kinds:
        parser.error(f"--outputs: {', '.join(unknown) or 'nothing'} is not one of {', '.join(KINDS)}")
    if sum(k.startswith("colbert") for k in args.kinds) > 1:
        parser.error("--outputs: one ColBERT type at a time")
    args.format = args.format or corpus.guess_format(args.input)
    args.output_format = "npy" if args.output.endswith(".npy") else "parquet"
    if args.output_format == "npy" and (len(args.kinds) != 1 or args.kinds[0] not in ("float", *QUANTIZED)):
        parser.error(".npy holds one vector per row: --outputs float, int8, uint8, binary or ubinary, alone")
    if args.window < 1 or (args.in_flight is not None and args.in_flight < 1):
        parser.error("--window and --in-flight must be at least 1")
    if not os.path.isfile(args.input):
        parser.error(f"no such file: {args.input}")
    return args


def bls_model(repository, model):
    """(the BLS model (many texts per request) of the export `model` names, its max length or None): from the
    repository's export.json files when it can read them (an id or a served name), else `model` taken as the
    ensemble's name."""
    exports = []
    for path in glob.glob(os.path.join(repository, "*", "1", "export.json")):
        try:
            with open(path, encoding="utf-8") as handle:
                exports.append(json.load(handle))
        except (OSError, ValueError):
            continue
    exports.sort(key=lambda e: e.get("name", ""))
    if model is None:  # the proxy's rule: `ensemble`, else the first by name (of those that embed texts)
        embedders = [e for e in exports if e.get("kind", "embedding") != "cross-encoder"]
        chosen = next((e for e in embedders if e.get("name") == "ensemble"), embedders[0] if embedders else None)
    else:
        chosen = next((e for e in exports if model in (e.get("id"), e.get("name"))), None) or \
            next((e for e in exports if model in (e.get("served_names") or ())), None)
    if chosen is not None:
        return chosen["bls_model"], chosen.get("max_length")
    name = model or "ensemble"
    return ("ensemble_bls" if name == "ensemble" else f"{name}_bls"), None


JOB_LAYOUT = 2  # parts with typed ids, duplicate_id rejects, blank lines skipped: an older job folder is not resumed


def main(argv=None):
    args = parse_args(argv)
    if args.format == "jsonl" and batch_file.is_batch_file(args.input):  # OpenAI's batch input: its own job
        return batch_file.run(args)
    if args.duplicates == "fail" and corpus.has_ids(args.format, args.id_field):  # before the server, before a part
        found = ids.first_duplicate(corpus.rows(args.input, args.format, args.id_field, args.text_field))
        if found:
            row, first = found
            raise SystemExit(f"embed: {ids.refusal(row.id, row.ordinal, first, args.format)}")
    parameters = {"dimensions": args.dimensions, "prompt_name": args.prompt_name, "input_type": args.input_type,
                  "colbert_pool_factor": args.colbert_pool_factor}
    # --no-truncate: the request parameter truncate false, the tokenizer refuses a text over the max length
    sent = {**parameters, "truncate": None if args.truncate else False}
    if args.http:
        door, target = HttpDoor(args.http, args.model, args.kinds, sent), args.model or "(default)"
    else:
        target, max_length = bls_model(args.repository, args.model)
        door = KServeDoor(args.grpc_url, target, args.kinds, sent, max_length)
    try:
        limits = door.limits()
    except JobError as error:
        raise SystemExit(f"embed: {error}") from None
    args.in_flight = args.in_flight or limits.in_flight
    stat = os.stat(args.input)
    settings = {"input": os.path.abspath(args.input), "input_bytes": stat.st_size, "input_mtime_ns": stat.st_mtime_ns,
                "format": args.format, "id_field": args.id_field, "text_field": args.text_field,
                "window": args.window, "model": target, "outputs": args.kinds, "truncate": args.truncate,
                "layout": JOB_LAYOUT, **parameters}
    # one writer per output, taken before anything of an earlier job is touched (held until this process ends)
    writer = lock.OutputLock(os.path.abspath(args.output)).acquire()
    work = store.Job(os.path.abspath(args.output), settings, restart=args.restart)
    source = argparse.Namespace(path=args.input, format=args.format, id_field=args.id_field,
                                text_field=args.text_field)
    door_name = f"HTTP {args.http}" if args.http else f"KServe gRPC {args.grpc_url}"
    print(f"embed: {args.input} -> {args.output} through {target} ({door_name}), {args.in_flight} requests in "
          f"flight of up to {limits.max_texts} texts", file=sys.stderr, flush=True)
    try:
        summary = job.run(door, limits, source, work, args)
    except JobError as error:
        raise SystemExit(f"embed: stopped: {error}. Finished windows are kept in {work.folder}: the same command "
                         f"goes on from there") from None
    except ids.DuplicateId as error:
        raise SystemExit(f"embed: {error}") from None
    except KeyboardInterrupt:
        print(f"\nembed: interrupted; the same command goes on from {work.folder}", file=sys.stderr)
        return 130
    checked = check_output(args, work)
    writer.release()
    if summary["id_kind"] == "json" and args.output_format == "parquet":
        print(f"embed: the ids mix integers and strings, so {args.output}'s id column holds each id's JSON text "
              f"(the integer 6 as 6, the string \"6\" as \"6\"; field metadata encoding=json)", file=sys.stderr)
    notes = [f"{summary['duplicates']} duplicate ids"] if summary["ids_checked"] else []
    notes += [f"listed in {work.rejects_path}"] if summary["rejected"] else []
    notes = f" ({'; '.join(notes)})" if notes else ""
    print(f"embed: done: {summary['embedded']} rows in {args.output}, {summary['rejected']} rejected{notes}, "
          f"{summary['truncated']} truncated "
          f"this run; {summary['texts_per_s']:.1f} texts/s, {summary['tokens_per_s']:.0f} tokens/s over "
          f"{summary['seconds']:.1f} s", file=sys.stderr, flush=True)
    print(f"embed: checked: {checked}", file=sys.stderr, flush=True)
    return 0


def check_output(args, work):
    """The files read back must account for the corpus: rows + rejects = its rows, every row's id its own. A file
    that does not (a window lost, another writer's rows) fails the job with the figures, exit 1."""
    found = store.read_back(os.path.abspath(args.output), args.output_format, work.rejects_path)
    expected = corpus.count(args.input, args.format)
    if expected is None:  # CSV: only reading it tells
        expected = sum(1 for _ in corpus.rows(args.input, args.format, args.id_field, args.text_field))
    figures = (f"{found['rows']} rows in {args.output} + {found['rejects']} rejected = "
               f"{found['rows'] + found['rejects']}, the corpus holds {expected}; {found['distinct_ids']} distinct "
               f"ids over {found['ids']} rows")
    if found["rows"] + found["rejects"] != expected or found["distinct_ids"] != found["rows"] \
            or found["ids"] != found["rows"]:
        raise SystemExit(f"embed: the output does not account for the corpus: {figures}")
    return figures


if __name__ == "__main__":
    sys.exit(main())

"""`scaletrain export RUN_DIR [-o DIR] [--dtype bf16] [--upload URI]`: a standalone model directory from a run
(scaletrain/after/export.py: a LoRA adapter merged into its base one safetensors shard at a time), uploaded to object
storage where asked."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("export", parents=parents, help="a standalone model directory from a run (LoRA merged "
                                                        "shard by shard)")
    p.add_argument("run_dir", help="a finished run directory")
    p.add_argument("-o", "--out", help="the directory to write (default RUN_DIR/export; never overwritten)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"],
                   help="the dtype written (default: the one the base checkpoint is stored in)")
    p.add_argument("--base", metavar="DIR", help="the original-precision model to merge a LoRA adapter into "
                                                  "(default: the base the run trained from; needed where that was a "
                                                  "pre-quantized GPTQ/AWQ checkpoint)")
    p.add_argument("--upload", metavar="URI", help="then upload the export to object storage (s3://, gs://, "
                                                    "abfs://; a new path, never overwritten)")
    p.add_argument("--endpoint-url", help="an S3-compatible store's URL (MinIO, Ceph) for s3:// paths")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scaletrain.after.export import export_run
    from scaletrain.console import console
    from scaletrain.errors import ConfigError
    from scaletrain.storage.mirror import check_upload_target, upload_tree
    from scaletrain.storage.uri import is_uri

    upload = None
    if args.upload:  # checked before the export is made
        if not is_uri(args.upload):
            raise ConfigError(f"--upload {args.upload}: not an object-storage URI; give s3://, gs:// or abfs:// "
                              f"(a local export is -o DIR)")
        upload = check_upload_target(args.upload, args.endpoint_url, "--upload")
    if is_uri(args.run_dir):
        done = _export_from_store(args)
    else:
        done = export_run(args.run_dir, args.out, args.dtype, args.base)
    what = (f"{done.merged} LoRA weight(s) merged" + (f", {done.replaced} saved module tensor(s) written"
                                                      if done.replaced else "") if done.merged or done.replaced
            else "the fine-tuned weights")
    console.print(f"exported {done.path}: {done.shards} shard(s), {what}, {done.dtype}, {done.bytes / 1e9:.2f} GB",
                  soft_wrap=True)
    if upload is not None:
        upload_tree(done.path, upload, "--upload")
        console.print(f"uploaded {done.path} to {upload.uri}", soft_wrap=True)
    return 0


def _export_from_store(args: argparse.Namespace):
    """A run on object storage: its config and final/ downloaded beside the target (removed after), then exported
    as a local run; the target is a local directory, named with -o."""
    import shutil
    import tempfile
    from pathlib import Path

    from scaletrain.after.export import export_run
    from scaletrain.errors import ConfigError
    from scaletrain.storage.mirror import fetch_final

    if not args.out:
        raise ConfigError(f"export {args.run_dir}: a run on object storage; give -o DIR, the local directory to "
                          f"write")
    target = Path(args.out).expanduser().resolve()
    if target.exists():
        raise ConfigError(f"export -o {target}: exists; an export never overwrites (choose another -o or remove it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.fetch-", dir=target.parent))
    try:
        run = fetch_final(args.run_dir, args.endpoint_url, staging / args.run_dir.rstrip("/").rsplit("/", 1)[-1])
        return export_run(run, target, args.dtype, args.base)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

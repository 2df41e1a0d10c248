#!/usr/bin/env python3
"""Regenerate the trust root shipped in grpo_conform/evidence/trust/ (maintainers only).

The root keys are offline: pass their private PEM files from wherever they are kept (never from
the repository). Only signed metadata is written.

  # the evidence keys list (targets.json, next version), signed by the root keys:
  tools/trust-root.py targets --root-key K1.pem --root-key K2.pem --keys evidence/keys/trusted-keys.json
  # a new root version (rotation): signed by a threshold of the old AND of the new root keys:
  tools/trust-root.py root --root-key OLD1.pem --root-key OLD2.pem --root-key NEW.pem \
      --new-root-public OLD2.pub.pem --new-root-public NEW.pub.pem --threshold 2
  # check what is there (the same verification `grpo-conform verify` does):
  tools/trust-root.py show

`--keys` is a trusted-keys list (format grpo-conform/trusted-keys/v1, docs/evidence.md): public key
files, owners, validity windows, revocations. That file is only the input of this script;
`grpo-conform verify` never reads it unless told to with --trusted-keys.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo_conform.evidence.keys import load_trusted_keys  # noqa: E402
from grpo_conform.evidence.trust import load_trust_root  # noqa: E402
from grpo_conform.evidence.trust_build import (EvidenceKey, build_root, build_targets, load_private,  # noqa: E402
                                               load_public, root_versions, sign_metadata, targets_version,
                                               write_metadata)

DEFAULT_DIR = ROOT / "grpo_conform" / "evidence" / "trust"


def _time(d: datetime | None) -> str | None:
    return d.strftime("%Y-%m-%dT%H:%M:%SZ") if d else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["root", "targets", "show"])
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="trust metadata folder (default: the shipped one)")
    ap.add_argument("--root-key", action="append", default=[], help="private PEM of a root key that signs")
    ap.add_argument("--new-root-public", action="append", default=[],
                    help="root: public PEM of a key of the new root (default: the signing keys)")
    ap.add_argument("--threshold", type=int, default=2, help="root: signatures needed (default 2)")
    ap.add_argument("--keys", type=Path, help="targets: the trusted-keys list to sign")
    ap.add_argument("--expires-days", type=int, default=None, help="root 730, targets 365 by default")
    ap.add_argument("--pinned", action="store_true", help="show: check against the pinned root key ids")
    args = ap.parse_args(argv)
    now = datetime.now(timezone.utc)
    if args.command == "show":
        trust = load_trust_root(args.dir, pinned=None if not args.pinned else load_trust_root.__kwdefaults__["pinned"])
        print(trust.source)
        for k in trust.keys:
            state = f"REVOKED ({k.revoked_reason})" if k.revoked else k.window()
            print(f"  {k.keyid}  {k.owner}  {state}")
        return 0
    signers = [load_private(p) for p in args.root_key]
    if not signers:
        ap.error("--root-key is required (the private PEM of each root key that signs)")
    if args.command == "root":
        versions = root_versions(args.dir)
        version = (versions[-1] + 1) if versions else 1
        public = [load_public(p) for p in args.new_root_public] or [k.public_key() for k in signers]
        if args.threshold > len(public):
            ap.error(f"threshold {args.threshold} exceeds the {len(public)} root key(s)")
        expires = now + timedelta(days=args.expires_days or 730)
        md = sign_metadata(build_root(version, public, args.threshold, expires), signers)
        out = args.dir / f"{version}.root.json"
        write_metadata(md, out)
        print(f"wrote {out} (root version {version}, threshold {args.threshold} of {len(public)})")
        return 0
    if args.keys is None:
        ap.error("targets needs --keys FILE (a trusted-keys list)")
    listed = load_trusted_keys(args.keys)
    evidence = [EvidenceKey(k.public_key, k.owner, _time(k.valid_from), _time(k.valid_until), k.revoked,
                            k.revoked_reason) for k in listed]
    expires = now + timedelta(days=args.expires_days or 365)
    version = targets_version(args.dir) + 1
    md = sign_metadata(build_targets(version, evidence, expires), signers)
    out = args.dir / "targets.json"
    write_metadata(md, out)
    print(f"wrote {out} (targets version {version}, {len(evidence)} key(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())

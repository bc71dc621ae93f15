"""The ablate stage's protocol on the GPU profile: configs/gpu.yaml's model, train and ablate
sections (GPT-2-small size, one CUDA GPU). The baseline is the train section with every speed
switch off (ablate.baseline), warm-started for ablate.warm_start_steps steps unless a checkpoint
folder of this model is given; the switches are then tried one after the other, cumulatively.

    python3 gpu/ablate.py OUT.json [--params configs/gpu.yaml] [--set section.key=value ...]
                          [--checkpoint-dir DIR] [--budget-s 420]

Writes OUT.json (the stage's metrics: a verdict per change, the profile, the protocol, plus the
device, torch and commit) and OUT.csv (the table, one row per change); OUT.partial.json after
every row, so a run cut short keeps what it measured. Changes not started within --budget-s
seconds are SKIPPED (the final comparison and the profiles still run, about a minute). On the
token cache instead of random tokens (carry data/cache to the GPU machine):
    python3 gpu/ablate.py out.json --set train.data=cache --set data.cache_dir=data/cache
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time
from pathlib import Path

import torch
from source_checkout import commit  # noqa: E402  (the checkout's ltm, installed or not)

from ltm.ablation.protocol import ablate, write_outputs
from ltm.ablation.switches import AblateConfig, SWITCHABLE
from ltm.data.cache import cache_dir_of
from ltm.data.batches import resolve_data
from ltm.params import ParamsError, apply_override, from_mapping, read_params



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the JSON to write (a CSV beside it)")
    parser.add_argument("--params", default="configs/gpu.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--checkpoint-dir", help="a train run's checkpoint folder of this model")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="changes not started by then are skipped")
    args = parser.parse_args()
    started = time.monotonic()
    # a run that hangs past its budget shows where
    faulthandler.dump_traceback_later(args.budget_s + 240, exit=False)
    params = read_params(args.params)
    for item in args.set:
        apply_override(params, item, "--set")
    # train.data auto (configs/gpu.yaml): decided once here, for every variant alike
    train = params.setdefault("train", {})
    train["data"] = resolve_data(train.get("data", "cache"), cache_dir_of(params))
    try:
        cfg = from_mapping(AblateConfig, params.get("ablate"), "ablate")
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial.json")
        result = ablate(cfg, {name: params.get(name) or {} for name in SWITCHABLE},
                        cache_dir_of(params), args.checkpoint_dir,
                        deadline=started + args.budget_s,
                        on_row=lambda rows: partial.write_text(json.dumps(rows, indent=1, default=str)))
    except ParamsError as err:
        raise SystemExit(f"error: {err}") from None
    write_outputs(result, out, out.with_suffix(".csv"))
    record = json.loads(out.read_text())
    record["protocol"].update(
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        torch=torch.__version__, commit=commit(), params=args.params, overrides=args.set,
        wall_s=round(time.monotonic() - started, 1))
    out.write_text(json.dumps(record, indent=1) + "\n")
    columns = ["switch", "verdict", "speedup", "speedup_low", "speedup_high", "step_ms",
               "delta_val_loss", "peak_memory_mib", "note"]
    print(result.table[columns].to_string(index=False))
    print(result.profile.pivot(index="group", columns="config", values="ms").round(2).to_string())
    print(f"wrote {out} in {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()

"""python3 -m joule: model specs from a PyTorch factory, and jobs from a training script.

  python3 -m joule spec MODULE:FACTORY --input 3,32,32 [--dtype token] [--loss mse] > spec.json
  python3 -m joule submit train.py --spec-from MODULE:FACTORY --input 3,32,32 \\
      --batch-size 64 --epochs 5 --samples-per-epoch 50000 [--name N] [--priority P] \\
      [--device cpu] [--url URL] [--token T] [--wait] [-- ARGS FOR train.py]

MODULE is a module name (imported with the current directory on sys.path) or a path to a .py
file; FACTORY an nn.Module there or a callable returning one. Errors print one line on stderr:
exit 2 for usage and spec errors, 1 when jouled refuses or a waited-for job does not succeed.
"""

import argparse
import importlib
import importlib.util
import json
import os
import sys

from ._client import ApiError, Client
from ._spec import LOSSES, OPTIMIZERS, SpecError, dumps, spec

USAGE_ERROR = 2


class UsageError(Exception):
    pass


def _load_factory(reference):
    module_name, colon, attribute = reference.rpartition(":")
    if not colon or not module_name or not attribute:
        raise UsageError(f"--spec-from/MODULE:FACTORY {reference!r}: expected MODULE:FACTORY, e.g. models:resnet")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = os.path.abspath(module_name)
            loaded = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
            if loaded is None or not os.path.isfile(path):
                raise UsageError(f"{module_name}: no such Python file")
            module = importlib.util.module_from_spec(loaded)
            sys.path.insert(0, os.path.dirname(path))
            loaded.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's module failing to import is one line
        raise UsageError(f"cannot import {module_name}: {type(error).__name__}: {error}") from None
    factory = getattr(module, attribute, None)
    if factory is None:
        raise UsageError(f"{module_name} has no {attribute}")
    import torch

    if isinstance(factory, torch.nn.Module):
        return factory
    try:
        model = factory()
    except Exception as error:  # noqa: BLE001
        raise UsageError(f"{reference}() failed: {type(error).__name__}: {error}") from None
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{reference}() returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _shape(text):
    try:
        dims = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        dims = []
    if not dims or any(dim < 1 for dim in dims):
        raise argparse.ArgumentTypeError(f"{text!r}: expected one sample's shape, e.g. 3,32,32")
    return dims


def _model_spec(args):
    try:
        import torch
    except ImportError:
        raise UsageError("making a spec needs PyTorch (import torch failed); on Debian: apt install "
                         "python3-torch") from None
    model = _load_factory(args.spec_from)
    shape = [args.example_batch] + args.input
    example = torch.zeros(shape, dtype=torch.long) if args.dtype == "token" else torch.zeros(shape)
    return spec(model, example, loss=args.loss, name=args.model_name or args.spec_from.rpartition(":")[2])


def _add_spec_options(parser):
    parser.add_argument("--input", type=_shape, required=True, metavar="D1,D2,...",
                        help="one sample's shape (the batch is left out), e.g. 3,32,32")
    parser.add_argument("--dtype", choices=("float", "token"), default="float",
                        help="token: integer ids for an embedding (default float)")
    parser.add_argument("--loss", choices=LOSSES, default="cross_entropy")
    parser.add_argument("--model-name", help="the spec's name (default: FACTORY)")
    parser.add_argument("--example-batch", type=int, default=2, help=argparse.SUPPRESS)


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other error here."""

    def error(self, message):
        print(f"joule: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(USAGE_ERROR)


def _parser():
    parser = _Parser(prog="python3 -m joule", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    spec_cmd = commands.add_parser("spec", help="print the Joule model spec of a PyTorch model")
    spec_cmd.add_argument("spec_from", metavar="MODULE:FACTORY")
    _add_spec_options(spec_cmd)

    submit = commands.add_parser("submit", help="submit a training script as a job, its model traced from FACTORY")
    submit.add_argument("script", help="the training script, run as PYTHON SCRIPT ARGS in the current directory")
    submit.add_argument("--spec-from", required=True, metavar="MODULE:FACTORY")
    _add_spec_options(submit)
    submit.add_argument("--batch-size", type=int, required=True)
    submit.add_argument("--epochs", type=int, required=True)
    submit.add_argument("--samples-per-epoch", type=int, required=True)
    submit.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                        help="the script's torch.optim optimizer (sgd_momentum: SGD with momentum); default sgd")
    submit.add_argument("--name", help="the job's name (default: the script's name)")
    submit.add_argument("--priority", type=int)
    submit.add_argument("--device", action="append", help="only devices matching this pattern (repeatable)")
    submit.add_argument("--python", default="python3", help="the interpreter the job runs (default python3)")
    submit.add_argument("--url", help="jouled's URL (default $JOULE_SERVER, else http://127.0.0.1:8571)")
    submit.add_argument("--token", help="API bearer token (default $JOULE_TOKEN)")
    submit.add_argument("--wait", action="store_true", help="wait for the job to end and print how it went")
    submit.add_argument("--dry-run", action="store_true", help="print the job instead of submitting it")
    return parser


def _job(args, script_args, model):
    for key in ("batch_size", "epochs", "samples_per_epoch"):
        if getattr(args, key) < 1:
            raise UsageError(f"--{key.replace('_', '-')} must be at least 1")
    job = {
        "name": args.name or os.path.splitext(os.path.basename(args.script))[0],
        "model": model,
        "training": {"batch_size": args.batch_size, "epochs": args.epochs,
                     "samples_per_epoch": args.samples_per_epoch, "optimizer": args.optimizer},
        "run": {"command": [args.python, args.script] + script_args, "workdir": os.getcwd()},
    }
    if args.device:
        job["constraints"] = {"devices": args.device}
    if args.priority is not None:
        job["priority"] = args.priority
    return job


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args = []
    if "--" in argv:  # everything after -- goes to the training script
        split = argv.index("--")
        argv, script_args = argv[:split], argv[split + 1:]
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        model = _model_spec(args)
        if args.command == "spec":
            sys.stdout.write(dumps(model))
            return 0
        if not os.path.isfile(args.script):
            raise UsageError(f"{args.script}: no such file")
        job = _job(args, script_args, model)
        if args.dry_run:
            print(json.dumps(job, indent=2))
            return 0
        client = Client(args.url, args.token)
        accepted = client.submit(job)
        print(accepted["id"], flush=True)
        if not args.wait:
            return 0
        done = client.wait(accepted["id"])
        energy = done.get("energy") or {}
        joules = f"{energy['joules']:.1f} J ({energy.get('source')})" if energy.get("joules") is not None else "no energy"
        seconds = f"{done['seconds']:.1f} s" if done.get("seconds") is not None else "- s"
        reason = f" ({done['reason']})" if done.get("reason") else ""
        print(f"{done['state']}{reason}: {seconds}, {joules}", flush=True)
        return 0 if done["state"] == "succeeded" else 1
    except (UsageError, SpecError) as error:
        print(f"joule: {error}", file=sys.stderr)
        return USAGE_ERROR
    except (ApiError, ValueError, OSError) as error:
        print(f"joule: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

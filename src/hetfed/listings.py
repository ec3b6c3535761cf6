"""What ``hetfed algorithms`` and ``hetfed components`` print: every registered algorithm with its parameters and
capabilities, every registered component of every kind with its parameters."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from hetfed.console import make_console

console = make_console()


def cmd_algorithms(args: argparse.Namespace) -> int:
    """What ``methods[i].algorithm`` may name, with each algorithm's ``params`` and capabilities."""
    from hetfed.algorithms import registry

    if args.privacy_table:
        print(registry.privacy_table(), end="")
        return 0
    specs = [registry.get(args.name)] if args.name else registry.specs()
    described = [s.describe() for s in specs]
    if args.json:
        console.print_json(json.dumps(described))
        return 0

    for d in described:
        caps = d["capabilities"]
        flags = [name for name, on in (("DP-FedAvg", caps["private"]), ("needs server data", caps["server_data"]),
                                       ("whole round at once", caps["whole_round"]),
                                       ("server model", caps["server_model"]),
                                       ("personalised", caps["personalises"]),
                                       ("asynchronous (simulated clock)", caps["asynchronous"]),
                                       ("stacks across runs and versions", caps["stacks_runs"]),
                                       ("server keeps a row per client", caps["per_client"])) if on]
        flags.append(f"batch-norm statistics: {caps['buffers']}")
        from rich.text import Text

        console.print(Text.assemble((d["name"], "bold"), f" — {d['summary']}"), soft_wrap=True)
        venue = f" ({d['venue']})" if d["venue"] and d["venue"] not in d["paper"] else ""
        console.print(f"  {d['family']} · paper: {d['paper']}{venue}", soft_wrap=True, markup=False)
        console.print(f"  uploads: {caps['uploads']}", soft_wrap=True, markup=False)
        extra = [f"views: {', '.join(caps['views'])}"] if caps["views"] else []
        if caps["model_kinds"]:
            extra.append(f"models: {', '.join(caps['model_kinds'])}")
        console.print(f"  {' · '.join(flags + extra) or '-'}", soft_wrap=True, markup=False)
        if d["params"]:
            console.print(params_table(d["params"], "methods[i].params."))
        console.print()
    return 0


def params_table(params: list[dict], prefix: str) -> Table:
    """A component's parameters (``hetfed.registry.describe_params``) as a table: key, default, allowed, meaning."""
    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 2, 0, 4))
    for col in (prefix, "default", "allowed", "meaning"):
        table.add_column(col, overflow="fold")
    for p in params:
        bounds = " ".join(f"{'>' if k == 'gt' else '≥' if k == 'ge' else '<' if k == 'lt' else '≤'} {v}"
                          for k, v in p["bounds"].items())
        default = repr(p["default"])
        table.add_row(p["name"], default if len(default) <= 24 else default[:23] + "…", bounds or p["type"],
                      p["description"])
    return table


def cmd_components(args: argparse.Namespace) -> int:
    """Every registered component of every kind (or of one), with its parameters."""
    from rich.text import Text

    from hetfed.components import components

    listed = components(args.kind, args.name)
    if args.json:
        console.print_json(json.dumps(listed))
        return 0
    for kind, entry in listed.items():
        console.print(Text.assemble((f"{kind}", "bold underline"), f"  ({entry['key']})"), soft_wrap=True)
        for c in entry["components"]:
            extra = [f"paper: {c['paper']}"] if c.get("paper") else []
            extra += [("streams" if c["streams"] else "needs every update of a round")] if "streams" in c else []
            extra += ["keeps a state between rounds"] if c.get("remembers") else []
            extra += ["trains on a labelled root set (a server_data holdout)"] if c.get("root") else []
            extra += [f"default lr {c['default_lr']:g}"] if "default_lr" in c else []
            extra += [f"takes {'/'.join(c['accepts'])} samples"] if c.get("accepts") else []
            extra += [f"inputs: {c['inputs']}"] if "inputs" in c and c["inputs"] != "features" else []
            where = "clients in this process" if c.get("in_process") else "clients elsewhere"
            extra += [where] if "in_process" in c else []
            console.print(Text.assemble(("  " + c["name"], "bold"), f" — {c['summary']}"), soft_wrap=True)
            if extra:
                console.print(f"    {' · '.join(extra)}", soft_wrap=True, markup=False)
            if c.get("params"):
                console.print(params_table(c["params"], f"{entry['params_key']}."))
        console.print()
    return 0

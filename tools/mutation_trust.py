#!/usr/bin/env python3
"""Mutation testing of edgekit's trust code: would the tests notice if a check broke?

Small AST mutations (one per run) are applied to the trust modules -- bundle/,
the plugin store and its policy, the plugin checks, the launch-rule language --
and only the tests that cover the mutated file run against each mutant. A
mutant the tests fail on is *killed*; one they pass on *survived* (a check
that could break unnoticed). A mutant that hangs past the per-mutant timeout
counts as killed by timeout (recorded as such): a refusal whose removal makes
verification loop forever is caught, if loudly.

The source tree is never edited: each test run gets ``MUTANT_*`` environment
variables and a ``sitecustomize`` on ``PYTHONPATH`` that installs an import
hook, which compiles the mutated AST of that one module (with its original
file name and line numbers). Subprocesses the tests start see the same mutant.

Mutation operators (names as in the JSON):

- ``cmp``       a comparison flipped: ``<``/``<=``, ``>``/``>=`` both ways and to the
                opposite strictness, ``==``/``!=``, ``in``/``not in``, ``is``/``is not``
- ``boolop``    ``and`` <-> ``or``
- ``not``       a ``not`` dropped (boolean negation)
- ``bool``      ``True`` <-> ``False``
- ``const``     an integer constant +1 and -1 (outside f-strings, which only word messages, and
                outside module-level UPPER_CASE constants: limits and tables are configuration;
                the comparisons that apply them are mutated)
- ``raise``     a ``raise`` statement replaced by ``pass`` (a dropped refusal)
- ``call``      a statement call to a checking helper dropped (``_fail``, ``check_*``,
                ``validate_*``, ``_raise_first``, ``problems.append`` ...): a dropped refusal
- ``return``    ``return X`` replaced by ``return None``

Usage::

    python tools/mutation_trust.py --list                # count mutants per file and operator
    nice python tools/mutation_trust.py --sample 330 --jobs 2 --out mutation.json
    python tools/mutation_trust.py --rerun mutation.json --only-survivors --out again.json

Not part of .ci/run: a full sample takes tens of minutes on two cores.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Source file -> (module name, the test files that cover it, most specific first).
TARGETS: dict[str, tuple[str, list[str]]] = {
    "edgekit/bundle/archive.py": ("edgekit.bundle.archive", [
        "tests/edgekit/bundle/test_archive.py", "tests/edgekit/bundle/test_plugin.py", "tests/edgekit/bundle/test_verify.py"]),
    "edgekit/bundle/canonical.py": ("edgekit.bundle.canonical", [
        "tests/edgekit/bundle/test_canonical.py", "tests/edgekit/bundle/test_archive.py",
        "tests/edgekit/bundle/test_manifest.py", "tests/edgekit/bundle/test_keys.py", "tests/edgekit/bundle/test_writer.py"]),
    "edgekit/bundle/golden.py": ("edgekit.bundle.golden", [
        "tests/edgekit/bundle/test_golden.py", "tests/edgekit/bundle/test_verify.py", "tests/edgekit/bundle/test_plugin.py"]),
    "edgekit/bundle/keys.py": ("edgekit.bundle.keys", [
        "tests/edgekit/bundle/test_keys.py", "tests/edgekit/bundle/test_plugin.py", "tests/edgekit/bundle/test_verify.py"]),
    "edgekit/bundle/manifest.py": ("edgekit.bundle.manifest", [
        "tests/edgekit/bundle/test_manifest.py", "tests/edgekit/bundle/test_verify.py", "tests/edgekit/bundle/test_writer.py"]),
    "edgekit/bundle/plugin.py": ("edgekit.bundle.plugin", [
        "tests/edgekit/bundle/test_plugin.py", "tests/edgekit/bundle/test_verify.py", "tests/edgekit/runtime/test_real_packages.py"]),
    "edgekit/bundle/verify.py": ("edgekit.bundle.verify", [
        "tests/edgekit/bundle/test_verify.py", "tests/edgekit/bundle/test_cli.py"]),
    "edgekit/bundle/writer.py": ("edgekit.bundle.writer", [
        "tests/edgekit/bundle/test_writer.py", "tests/edgekit/bundle/test_verify.py"]),
    "edgekit/runtime/plugin_store.py": ("edgekit.runtime.plugin_store", [
        "tests/edgekit/runtime/test_plugin_store.py", "tests/edgekit/runtime/test_plugin_store_attacks.py",
        "tests/edgekit/runtime/test_real_packages.py"]),
    "edgekit/runtime/plugin_policy.py": ("edgekit.runtime.plugin_policy", [
        "tests/edgekit/runtime/test_plugin_policy.py", "tests/edgekit/runtime/test_plugin_store.py",
        "tests/edgekit/runtime/test_plugin_store_attacks.py", "tests/edgekit/runtime/test_real_packages.py"]),
    "edgekit/runtime/plugin_checks.py": ("edgekit.runtime.plugin_checks", [
        "tests/edgekit/runtime/test_plugin_checks.py", "tests/edgekit/runtime/test_real_packages.py"]),
    "kernels/launch_rule.py": ("edgekit.kernels.launch_rule", [
        "tests/kernels/test_launch_rule.py", "tests/edgekit/bundle/test_plugin.py"]),
}
# runtime/gpu_runner.py is left out: it only runs on a CUDA GPU, and its tests skip here.

_CMP_SWAPS: dict[type, list[type]] = {
    ast.Lt: [ast.LtE, ast.GtE], ast.LtE: [ast.Lt, ast.Gt], ast.Gt: [ast.GtE, ast.LtE], ast.GtE: [ast.Gt, ast.Lt],
    ast.Eq: [ast.NotEq], ast.NotEq: [ast.Eq], ast.In: [ast.NotIn], ast.NotIn: [ast.In],
    ast.Is: [ast.IsNot], ast.IsNot: [ast.Is],
}
_CMP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.In: "in",
             ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
# A statement call to one of these is a check: dropping it is a dropped refusal.
_CHECK_CALL_PREFIXES = ("_fail", "_raise", "check", "_check", "validate", "verify", "_verify")


@dataclass
class Mutant:
    id: str  # "<file>:<index>", stable for one version of the file
    file: str
    index: int
    line: int
    op: str
    description: str
    source_line: str = ""
    status: str = "pending"  # killed | timeout | survived | error
    seconds: float = 0.0
    detail: str = ""


def _callee_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _is_check_call(stmt: ast.stmt) -> bool:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    call = stmt.value
    name = _callee_name(call)
    if name.startswith(_CHECK_CALL_PREFIXES):
        return True
    # problems.append(MemberProblem(...)) and checks.append(Check(..., "fail", ...)) record refusals
    return name == "append" and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
        and call.func.value.id in ("problems",)


def _is_constant_definition(stmt: ast.stmt) -> bool:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    return bool(targets) and all(isinstance(t, ast.Name) and t.id.lstrip("_").isupper() for t in targets)


class _Walker(ast.NodeTransformer):
    """Enumerates mutation points in a fixed order; with ``apply`` set, performs exactly that one."""

    def __init__(self, apply: int | None = None):
        self.apply = apply
        self.found: list[tuple[int, str, str]] = []  # (line, op, description)
        self._fstring = 0

    def _point(self, node: ast.AST, op: str, description: str) -> bool:
        index = len(self.found)
        self.found.append((getattr(node, "lineno", 0), op, description))
        return index == self.apply

    # f-strings only word messages: mutating their constants tells nothing about a check
    def visit_JoinedStr(self, node: ast.JoinedStr):
        self._fstring += 1
        self.generic_visit(node)
        self._fstring -= 1
        return node

    def visit_Compare(self, node: ast.Compare):
        self.generic_visit(node)
        for i, cmp in enumerate(node.ops):
            for new in _CMP_SWAPS.get(type(cmp), []):
                if self._point(node, "cmp", f"`{_CMP_TEXT[type(cmp)]}` -> `{_CMP_TEXT[new]}`"):
                    node.ops[i] = new()
        return node

    def visit_BoolOp(self, node: ast.BoolOp):
        self.generic_visit(node)
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        if self._point(node, "boolop", f"`{'and' if new is ast.Or else 'or'}` -> `{'or' if new is ast.Or else 'and'}`"):
            node.op = new()
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not) and self._point(node, "not", "`not` dropped"):
            return node.operand
        return node

    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, bool):
            if self._point(node, "bool", f"`{node.value}` -> `{not node.value}`"):
                return ast.copy_location(ast.Constant(not node.value), node)
        elif isinstance(node.value, int) and not self._fstring:
            for delta in (1, -1):
                if self._point(node, "const", f"`{node.value}` -> `{node.value + delta}`"):
                    return ast.copy_location(ast.Constant(node.value + delta), node)
        return node

    def visit_Raise(self, node: ast.Raise):
        self.generic_visit(node)
        if self._point(node, "raise", "`raise` dropped"):
            return ast.copy_location(ast.Pass(), node)
        return node

    def visit_Expr(self, node: ast.Expr):
        self.generic_visit(node)
        if _is_check_call(node) and self._point(node, "call", f"call `{_callee_name(node.value)}(...)` dropped"):
            return ast.copy_location(ast.Pass(), node)
        return node

    def visit_Return(self, node: ast.Return):
        self.generic_visit(node)
        if node.value is not None and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            if self._point(node, "return", "`return X` -> `return None`"):
                return ast.copy_location(ast.Return(ast.Constant(None)), node)
        return node

    # Module-level UPPER_CASE constants (limits, tables such as MAX_SHARED_BYTES_BY_ARCH) are
    # configuration, not check logic: the comparisons that use them are mutated instead.
    def visit_Module(self, node: ast.Module):
        node.body = [s if _is_constant_definition(s) else self.visit(s) for s in node.body]
        return node

    # type annotations are not behaviour
    def visit_arg(self, node: ast.arg):
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if node.value is not None:
            node.value = self.visit(node.value)
        return node

    def visit_FunctionDef(self, node):
        node.body = [self.visit(s) for s in node.body]
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.args.defaults = [self.visit(d) for d in node.args.defaults]
        node.args.kw_defaults = [self.visit(d) if d is not None else None for d in node.args.kw_defaults]
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def mutated_tree(path: Path, index: int | None) -> tuple[ast.Module, list[tuple[int, str, str]]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    walker = _Walker(apply=index)
    tree = walker.visit(tree)
    ast.fix_missing_locations(tree)
    return tree, walker.found


def enumerate_mutants(files: list[str]) -> list[Mutant]:
    out = []
    for rel in files:
        lines = (ROOT / rel).read_text().splitlines()
        _, found = mutated_tree(ROOT / rel, None)
        for i, (line, op, desc) in enumerate(found):
            out.append(Mutant(f"{rel}:{i}", rel, i, line, op, desc, lines[line - 1].strip() if line else ""))
    return out


# --------------------------------------------------------------------------- the import hook (runs in test processes)
def install_hook_from_env() -> None:
    """Called by the generated sitecustomize: make MUTANT_MODULE import as mutant MUTANT_INDEX of MUTANT_FILE."""
    import importlib.abc
    import importlib.util

    module, path, index = os.environ["MUTANT_MODULE"], Path(os.environ["MUTANT_FILE"]), int(os.environ["MUTANT_INDEX"])

    class Loader(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, mod):
            tree, _ = mutated_tree(path, index)
            exec(compile(tree, str(path), "exec"), mod.__dict__)

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, target_path=None, target=None):
            if fullname != module:
                return None
            return importlib.util.spec_from_file_location(fullname, path, loader=Loader())

    sys.meta_path.insert(0, Finder())


_SITECUSTOMIZE = """\
import os, sys
if os.environ.get("MUTANT_MODULE"):
    sys.path.insert(0, {scripts!r})
    import mutation_trust
    mutation_trust.install_hook_from_env()
    sys.path.remove({scripts!r})
"""


# --------------------------------------------------------------------------- running
def run_mutant(m: Mutant, hook_dir: Path, timeout_s: float, python: str) -> Mutant:
    module, tests = TARGETS[m.file]
    tests = [t for t in tests if (ROOT / t).exists()]
    env = dict(os.environ, MUTANT_MODULE=module, MUTANT_FILE=str(ROOT / m.file), MUTANT_INDEX=str(m.index),
               PYTHONPATH=os.pathsep.join([str(hook_dir), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-m", "not gpu",
           "--no-header", "-o", "addopts=", *tests]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        m.status, m.seconds, m.detail = "timeout", time.monotonic() - t0, f"no result after {timeout_s:.0f} s"
        return m
    m.seconds = time.monotonic() - t0
    text = out.decode(errors="replace")
    if rc == 0:
        m.status = "survived"
    elif rc == 1:
        m.status = "killed"
        failed = [ln for ln in text.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        m.detail = failed[0][:200] if failed else text.strip().splitlines()[-1][:200]
    else:  # collection error, import error of the mutant itself, internal error: the tests noticed too
        m.status = "killed"
        m.detail = f"pytest exit {rc}: " + (text.strip().splitlines() or [""])[-1][:200]
    return m


def baseline_ok(hook_dir: Path, python: str) -> None:
    tests = sorted({t for _, ts in TARGETS.values() for t in ts if (ROOT / t).exists()})
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-m", "not gpu", *tests],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"the unmutated tests fail; fix them first:\n{r.stdout[-3000:]}")


def sample(mutants: list[Mutant], n: int, seed: int) -> list[Mutant]:
    """A uniform random sample of n mutants (every mutant equally likely), in a stable order."""
    if n >= len(mutants):
        return mutants
    rng = random.Random(seed)
    chosen = set(rng.sample(range(len(mutants)), n))
    return [m for i, m in enumerate(mutants) if i in chosen]


def summarize(mutants: list[Mutant]) -> dict:
    def score(ms):
        done = [m for m in ms if m.status in ("killed", "timeout", "survived")]
        caught = sum(m.status in ("killed", "timeout") for m in done)
        return {"mutants": len(done), "killed": sum(m.status == "killed" for m in done),
                "timeout": sum(m.status == "timeout" for m in done), "survived": len(done) - caught,
                "score": round(caught / len(done), 4) if done else None}

    return {
        "total": score(mutants),
        "by_file": {f: score([m for m in mutants if m.file == f]) for f in sorted({m.file for m in mutants})},
        "by_operator": {o: score([m for m in mutants if m.op == o]) for o in sorted({m.op for m in mutants})},
    }


def print_table(mutants: list[Mutant], summary: dict) -> None:
    print(f"\n{'file':36} {'mutants':>7} {'killed':>6} {'timeout':>7} {'survived':>8} {'score':>6}")
    for f, s in summary["by_file"].items():
        print(f"{f:36} {s['mutants']:7} {s['killed']:6} {s['timeout']:7} {s['survived']:8} {s['score'] or 0:6.1%}")
    t = summary["total"]
    print(f"{'TOTAL':36} {t['mutants']:7} {t['killed']:6} {t['timeout']:7} {t['survived']:8} {t['score'] or 0:6.1%}")
    survivors = [m for m in mutants if m.status == "survived"]
    if survivors:
        print(f"\nsurvivors ({len(survivors)}):")
        for m in survivors:
            print(f"  {m.file}:{m.line} [{m.op}] {m.description}    {m.source_line[:90]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", nargs="*", default=sorted(TARGETS), help="source files to mutate (default: all trust files)")
    ap.add_argument("--sample", type=int, default=0, help="run a uniform random sample of this many mutants (0: all)")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once (the dev machine has 2 cores: 1-2)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per mutant; a hang counts as killed (timeout)")
    ap.add_argument("--out", type=Path, default=Path("mutation_trust.json"))
    ap.add_argument("--list", action="store_true", help="only count the mutants")
    ap.add_argument("--rerun", type=Path, help="run the mutants of an earlier JSON result again")
    ap.add_argument("--only-survivors", action="store_true", help="with --rerun: only those that survived")
    ap.add_argument("--ids", nargs="*", help="run only these mutant ids (file:index)")
    ap.add_argument("--no-baseline", action="store_true", help="skip checking that the unmutated tests pass")
    args = ap.parse_args(argv)

    for f in args.files:
        if f not in TARGETS:
            ap.error(f"{f} is not a trust file this script knows; known: {', '.join(sorted(TARGETS))}")
    every = enumerate_mutants(args.files)
    if args.list:
        for f in args.files:
            ms = [m for m in every if m.file == f]
            ops = {o: sum(m.op == o for m in ms) for o in sorted({m.op for m in ms})}
            print(f"{f:36} {len(ms):5}  {ops}")
        print(f"{'TOTAL':36} {len(every):5}")
        return 0
    if args.rerun:
        previous = json.loads(args.rerun.read_text())["mutants"]
        wanted = {p["id"]: p for p in previous if not args.only_survivors or p["status"] == "survived"}
        todo = [m for m in every if m.id in wanted]
        # ids are positions in a file's mutants: after an edit of that file they name other mutants
        moved = [m.id for m in todo if (m.line, m.description) != (wanted[m.id]["line"], wanted[m.id]["description"])]
        if moved:
            sys.exit(f"{len(moved)} mutants changed since {args.rerun} (the source was edited), e.g. {moved[:3]}; "
                     "run a fresh sample instead")
        sampled_from = f"rerun of {args.rerun}"
    else:
        todo = sample(every, args.sample, args.seed) if args.sample else every
        sampled_from = f"uniform sample of {len(todo)} from {len(every)} (seed {args.seed})" if args.sample else "all"
    if args.ids:
        todo = [m for m in every if m.id in set(args.ids)]
        sampled_from = "chosen ids"

    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="edgekit-mutation-") as hook:
        hook_dir = Path(hook)
        (hook_dir / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(scripts=str(ROOT / "scripts")))
        if not args.no_baseline:
            baseline_ok(hook_dir, python)
        started = time.monotonic()
        done = 0
        lock = threading.Lock()

        def write(results: list[Mutant]) -> None:
            doc = {
                "what": "mutation testing of edgekit's trust code (tools/mutation_trust.py), measured on the CPU",
                "sample": sampled_from,
                "operators": ["cmp", "boolop", "not", "bool", "const", "raise", "call", "return"],
                "timeout_s": args.timeout,
                "jobs": args.jobs,
                "wall_s": round(time.monotonic() - started, 1),
                "complete": all(m.status != "pending" for m in results),
                "summary": summarize(results),
                "mutants": [asdict(m) for m in results],
            }
            tmp = args.out.with_name(f".{args.out.name}.tmp")
            tmp.write_text(json.dumps(doc, indent=2) + "\n")
            os.replace(tmp, args.out)

        def one(m: Mutant) -> Mutant:
            nonlocal done
            run_mutant(m, hook_dir, args.timeout, python)
            with lock:  # progress is on disk after every mutant: a stopped run loses nothing
                done += 1
                print(f"[{done}/{len(todo)}] {m.status:8} {m.seconds:5.1f}s {m.file}:{m.line} [{m.op}] {m.description}",
                      flush=True)
                write(todo)
            return m

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(one, todo))
        write(results)
    summary = summarize(results)
    print_table(results, summary)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

# Sourced, not run: MAPPED_DIRS lists the top-level folders that pyproject's package-dir mapping (setup.py's
# PACKAGE_DIRS) maps into the edgekit package (edgekit.kernels -> kernels/, ...). Scripts that stage the package
# the way the wheel installs it (scripts/lint_imports.sh, tools/gpu_setup.sh, tools/gpu_carry.sh's A/B trees)
# read the list from there instead of keeping their own. setup.py is parsed, not imported (importing it builds).
# PACKAGE_DIRS_SETUP: another setup.py to read (an A/B base commit's own, written to a file).
MAPPED_DIRS=$(python3 - "${PACKAGE_DIRS_SETUP:-$(CDPATH= cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." >/dev/null && pwd)/setup.py}" <<'PY'
import ast, sys

tree = ast.parse(open(sys.argv[1]).read())
(dirs,) = [ast.literal_eval(n.value) for n in tree.body
           if isinstance(n, ast.Assign) and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["PACKAGE_DIRS"]]
print(" ".join(folder for name, folder in dirs.items() if name != "edgekit"))
PY
) || { echo "cannot read PACKAGE_DIRS from setup.py" >&2; return 1; }

"""Package discovery that follows the package-dir mapping, so the package list cannot drift.

Import names map onto top-level folders (docs/architecture.md: ``edgekit.kernels`` lives in
``kernels/``, ...). Every sub-folder of a mapped folder is a package of the
wheel (namespace discovery: data folders such as ``edgekit/quant/data`` too), so
a new module or sub-package ships without editing a list. Everything else
(metadata, dependencies, package data) is in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

PACKAGE_DIRS = {
    "edgekit": "edgekit",
    "edgekit.kernels": "kernels",
    "edgekit.power": "power",
    "edgekit.export": "export",
    "edgekit.targets": "targets",
}


def discover_packages(package_dirs: dict[str, str]) -> list[str]:
    packages = []
    for name, folder in package_dirs.items():
        packages.append(name)
        packages += [f"{name}.{sub}" for sub in find_namespace_packages(folder, exclude=["*__pycache__*"])]
    return sorted(packages)


setup(package_dir=PACKAGE_DIRS, packages=discover_packages(PACKAGE_DIRS))

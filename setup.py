"""Packaging for minitransformer. Everything it needs comes from settings.ini (nbdev 2's config),
so the version and the dependencies are stated once."""
from configparser import ConfigParser
from pathlib import Path

from setuptools import find_packages, setup

cfg = ConfigParser(delimiters=["="])
if not cfg.read(Path(__file__).parent / "settings.ini", encoding="utf-8"):
    raise SystemExit("setup.py needs settings.ini next to it (the sdist carries it through MANIFEST.in)")
c = cfg["DEFAULT"]

licenses = {"apache2": "Apache-2.0"}  # settings.ini's name -> the SPDX expression (PEP 639)
statuses = ["1 - Planning", "2 - Pre-Alpha", "3 - Alpha", "4 - Beta", "5 - Production/Stable"]
extras = {key[: -len("_requirements")]: c[key].split()
          for key in c if key.endswith("_requirements") and c[key].strip()}

setup(
    name=c["lib_name"],
    version=c["version"],
    description=c["description"],
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    author=c["author"],
    author_email=c["author_email"],
    url=c["git_url"],
    project_urls={"Documentation": c["doc_host"] + c["doc_baseurl"], "Source": c["git_url"],
                  "Changelog": c["git_url"] + "/blob/main/CHANGELOG.md",
                  "Issues": c["git_url"] + "/issues"},
    license_expression=licenses[c["license"]],
    license_files=["LICENSE"],  # into the wheel's .dist-info and the sdist (MANIFEST.in too)
    keywords=c["keywords"].split(),
    classifiers=[
        "Development Status :: " + statuses[int(c["status"]) - 1],
        "Intended Audience :: " + c["audience"].title(),
        "Natural Language :: " + c["language"].title(),
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    python_requires=">=" + c["min_python"],
    packages=find_packages(include=[c["lib_name"], c["lib_name"] + ".*"]),
    include_package_data=True,
    package_data={c["lib_name"]: ["py.typed"]},  # PEP 561: the package's annotations are for checkers
    install_requires=c["requirements"].split(),
    extras_require=extras,
    entry_points={"console_scripts": c.get("console_scripts", "").split()},
    zip_safe=False,
)

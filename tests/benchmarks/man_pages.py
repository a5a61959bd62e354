"""German manual pages: development data for German keyword search, apart from the help pages
kept for acceptance (issue 77). Questions a native speaker would type, written 2026-11-28
before any search of these pages.

Usage:
  apt-get download manpages-de          # Debian's German translations (GPL), 438 section-1 pages
  python -m tests.benchmarks.man_pages write manpages-de_*.deb OUT
  python -m tests.benchmarks.man_pages check OUT [--index DIR] [--modes ...] [-- BUILD ARGS...]

``write`` renders each section-1 page with groff (preconv reading its UTF-8) into ``OUT/NAME.txt``,
plain UTF-8 text without overstrike; ``check`` is the help pages' (a question counts where an
accepted page is in the top 3).
"""

from __future__ import annotations

import gzip
import subprocess
import tempfile
from pathlib import Path

from tests.benchmarks.help_pages import Questions, check_in_fresh_index, commands, parse_with_build_args

QUESTIONS: Questions = [
    ("Dateien nach Änderungsdatum sortiert anzeigen", ("ls", "dir", "vdir")),
    ("Zugriffsrechte einer Datei ändern", ("chmod",)),
    ("Besitzer einer Datei ändern", ("chown",)),
    ("freien Speicherplatz auf der Festplatte anzeigen", ("df",)),
    ("Größe eines Verzeichnisses ermitteln", ("du",)),
    ("die letzten Zeilen einer Logdatei ausgeben", ("tail",)),
    ("Zeilen, Wörter und Zeichen in einer Datei zählen", ("wc",)),
    ("ein Archiv entpacken", ("tar", "gunzip", "bunzip2", "cpio")),
    ("doppelte Zeilen entfernen", ("uniq", "sort")),
    (
        "Prüfsumme einer Datei berechnen",
        ("sha256sum", "md5sum", "cksum", "sha1sum", "b2sum", "sha224sum", "sha384sum", "sha512sum", "sum"),
    ),
    ("Dateien sicher löschen, damit sie nicht wiederhergestellt werden können", ("shred",)),
    ("symbolischen Link erstellen", ("ln",)),
    ("Zeitzone einstellen", ("timedatectl", "tzselect")),
    ("Text in einer Datei suchen und ersetzen", ("sed",)),
    ("einen Befehl mit niedrigerer Priorität ausführen", ("nice", "renice")),
    ("Dateien über SSH zwischen Rechnern kopieren", ("scp", "sftp")),
    ("Systemprotokolle ansehen", ("journalctl", "dmesg")),
    ("zwei Dateien vergleichen und Unterschiede anzeigen", ("diff", "cmp", "sdiff", "wdiff", "diff3")),
    ("eine Datei in mehrere Teile aufteilen", ("split", "csplit")),
    ("Dienst beim Systemstart automatisch starten", ("systemctl",)),
    ("Befehl nach einer bestimmten Zeit abbrechen", ("timeout",)),
    ("eine leere Datei anlegen", ("touch",)),
    ("SSH-Schlüsselpaar erzeugen", ("ssh-keygen",)),
    ("Kodierung einer Textdatei umwandeln", ("iconv",)),
]
SECTION = "usr/share/man/de/man1"


def write(package: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ragidx-man-") as folder:
        subprocess.run(["dpkg-deb", "-x", str(package), folder], check=True)
        for page in sorted((Path(folder) / SECTION).glob("*.1.gz")):
            source = gzip.decompress(page.read_bytes())
            rendered = subprocess.run(
                ["groff", "-k", "-Tutf8", "-mandoc", "-P-cbou"], input=source, capture_output=True, check=True
            )
            (out / f"{page.name.removesuffix('.1.gz')}.txt").write_bytes(rendered.stdout)
    print(f"de: {sum(1 for _ in out.glob('*.txt'))} pages")


def main() -> None:
    parser, _, _ = commands(__doc__ or "", "package")
    args, extra = parse_with_build_args(parser)
    if args.command == "write":
        write(args.package, args.out)
        return
    check_in_fresh_index(args.corpus, QUESTIONS, "de", args.index, args.modes.split(","), extra)


if __name__ == "__main__":
    main()

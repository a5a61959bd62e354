"""Manual pages in German, Chinese and Japanese: development data for those languages apart from
the help pages kept for acceptance (issue 77). Questions a native speaker would type, written
2026-11-28 before any search of these pages. English: the originals of the pages Debian translated
into German, as installed here, with questions as people phrase them (in words the page may not
use), written 2026-11-28 before any search of them: development data for the hybrid judge (issue 78).

Usage:
  apt-get download manpages-de manpages-zh manpages-ja   # Debian's translations (GPL)
  python -m tests.benchmarks.man_pages write manpages-de_*.deb OUT --language de
  python -m tests.benchmarks.man_pages check OUT --language de [--index DIR] [--modes ...]
      [-- BUILD ARGS...]
  python -m tests.benchmarks.man_pages write manpages-de_*.deb OUT --language en   # /usr/share/man/man1

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

GERMAN: Questions = [
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
CHINESE: Questions = [
    ("显示目录中的所有文件", ("ls",)),
    ("改变文件的访问权限", ("chmod",)),
    ("修改文件属于哪个用户组", ("chgrp", "chown")),
    ("查看内存使用情况", ("free",)),
    ("计算目录占用的磁盘空间", ("du",)),
    ("显示文件的开头几行", ("head",)),
    ("删除一个空目录", ("rmdir",)),
    ("新建一个文件夹", ("mkdir",)),
    ("把压缩文件解压出来", ("gunzip", "bunzip2", "tar", "zcat")),
    ("按字母顺序排列文本行", ("sort",)),
    ("查找系统中的文件", ("find",)),
    ("在文本中查找匹配的行", ("grep", "egrep", "fgrep")),
    (
        "计算文件的校验和",
        ("md5sum", "sha1sum", "sha256sum", "cksum", "sum", "sha224sum", "sha384sum", "sha512sum", "b2sum"),
    ),
    ("重命名或移动文件", ("mv",)),
    ("查看系统运行了多长时间", ("uptime", "w")),
    ("设置系统时间和日期", ("date", "timedatectl")),
    ("终止一个进程", ("kill", "killall")),
    ("登录远程主机", ("ssh", "rlogin")),
    ("查看当前登录的用户", ("who", "w", "users")),
    ("以十六进制显示文件内容", ("xxd", "od")),
    ("备份 PostgreSQL 数据库", ("pg_dump", "pg_dumpall")),
    ("定时在某个时间执行命令", ("at",)),
    ("将文件打包成归档", ("tar", "ar", "cpio")),
    ("转换文本文件的字符编码", ("iconv",)),
]
JAPANESE: Questions = [
    ("ファイルのアクセス権を変更する", ("chmod", "setfacl")),
    ("ファイルの所有者を変える", ("chown",)),
    ("ディレクトリの中身を一覧表示する", ("ls", "dir", "vdir")),
    ("ディスクの空き容量を調べる", ("df",)),
    ("実行中のプロセスを表示する", ("ps", "pstree", "pgrep")),
    ("ファイルの最後の数行を見る", ("tail",)),
    ("圧縮ファイルを展開する", ("gunzip", "bunzip2", "tar", "xz", "zcat")),
    ("重複した行を取り除く", ("uniq", "sort")),
    ("二つのファイルの違いを比較する", ("diff", "cmp", "sdiff", "diff3")),
    ("空のディレクトリを削除する", ("rmdir",)),
    ("シンボリックリンクを作成する", ("ln",)),
    ("ファイルを安全に消去する", ("shred",)),
    ("文字コードを変換する", ("iconv",)),
    ("指定した時刻にコマンドを実行する", ("at", "batch")),
    ("プロセスを名前で終了させる", ("pkill", "killall", "skill")),
    ("コマンドの実行時間を計る", ("time",)),
    ("リモートのマシンにログインする", ("rlogin", "telnet", "rsh")),
    ("ファイルを検索する", ("find", "locate")),
    ("行数を数える", ("wc",)),
    ("文字列を置換する", ("sed", "tr")),
    ("メモリの使用量を表示する", ("free",)),
    ("システムの稼働時間を表示する", ("uptime", "w")),
    ("一定時間待つ", ("sleep",)),
    ("パッチを適用する", ("patch",)),
]
ENGLISH: Questions = [
    ("list files with the most recently changed first", ("ls", "dir", "vdir")),
    ("let everyone run my script", ("chmod",)),
    ("give a file to another user", ("chown",)),
    ("how much room is left on my drives", ("df",)),
    ("how big is this folder", ("du",)),
    ("follow a log file as new lines come in", ("tail",)),
    ("how many words are in this text", ("wc",)),
    ("unpack a tarball", ("tar", "gunzip", "gzip", "zcat")),
    ("get rid of repeated lines in a list", ("uniq", "sort")),
    (
        "check that a download was not corrupted",
        ("sha256sum", "md5sum", "cksum", "sha1sum", "b2sum", "sha224sum", "sha384sum", "sha512sum", "sum"),
    ),
    ("wipe a file so nobody can recover it", ("shred",)),
    ("make a shortcut to a file in another folder", ("ln",)),
    ("switch the machine to another time zone", ("timedatectl", "tzselect")),
    ("replace a word everywhere in a file", ("sed",)),
    ("run a heavy job without slowing the machine down", ("nice", "renice", "ionice")),
    ("send files to another computer securely", ("scp", "sftp", "rsync")),
    ("read the messages the kernel printed at boot", ("dmesg", "journalctl")),
    ("see what changed between two versions of a file", ("diff", "cmp", "sdiff", "wdiff", "diff3")),
    ("cut a big file into smaller pieces", ("split", "csplit")),
    ("start a service automatically when the computer boots", ("systemctl",)),
    ("stop a command if it takes too long", ("timeout",)),
    ("update the date a file was last modified", ("touch",)),
    ("who else is logged in right now", ("who", "w", "users")),
    ("which folder am I in", ("pwd",)),
    ("how long did that command take", ("time",)),
    ("convert a text file to UTF-8", ("iconv",)),
    ("end every process of a program by its name", ("pkill", "killall")),
    ("locate a file somewhere on the disk", ("find", "locate")),
    ("how much memory is free", ("free", "vmstat", "top")),
    ("wait a few seconds in a shell script", ("sleep",)),
]
QUESTIONS = {"de": GERMAN, "zh": CHINESE, "ja": JAPANESE, "en": ENGLISH}
SECTIONS = {"de": "usr/share/man/de/man1", "zh": "usr/share/man/zh_CN/man1", "ja": "usr/share/man/ja/man1"}
INSTALLED_ENGLISH = Path("/usr/share/man/man1")  # English takes each German page's original from here


def write(package: Path, out: Path, language: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ragidx-man-") as folder:
        subprocess.run(["dpkg-deb", "-x", str(package), folder], check=True)
        for page in sorted((Path(folder) / SECTIONS.get(language, SECTIONS["de"])).glob("*.1.gz")):
            if language == "en":
                page = INSTALLED_ENGLISH / page.name
                if not page.exists():
                    continue
            source = gzip.decompress(page.read_bytes())
            rendered = subprocess.run(
                ["groff", "-k", "-Tutf8", "-mandoc", "-P-cbou"], input=source, capture_output=True, check=True
            )
            (out / f"{page.name.removesuffix('.1.gz')}.txt").write_bytes(rendered.stdout)
    print(f"{language}: {sum(1 for _ in out.glob('*.txt'))} pages")


def main() -> None:
    parser, writing, checking = commands(__doc__ or "", "package")
    for sub in (writing, checking):
        sub.add_argument("--language", required=True, choices=sorted(QUESTIONS))
    args, extra = parse_with_build_args(parser)
    if args.command == "write":
        write(args.package, args.out, args.language)
        return
    asked = QUESTIONS[args.language]
    check_in_fresh_index(args.corpus, asked, args.language, args.index, args.modes.split(","), extra)


if __name__ == "__main__":
    main()

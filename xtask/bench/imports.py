# Many stdlib imports (many distinct Python + native stacks), then a loop allocating objects.
import sys, time
print("PID", __import__("os").getpid(), flush=True)
mods = """asyncio email json xml.dom.minidom xml.etree.ElementTree http.client urllib.request
unittest logging argparse decimal fractions statistics csv sqlite3 zipfile tarfile gzip bz2 lzma
difflib textwrap pprint dataclasses typing enum functools itertools collections heapq bisect
configparser tomllib shlex glob fnmatch tempfile shutil pathlib uuid hashlib hmac secrets base64
binascii struct codecs locale gettext calendar datetime zoneinfo socket ssl select selectors
threading multiprocessing concurrent.futures subprocess signal queue sched contextvars
inspect ast dis tokenize pydoc doctest pickle copy shelve dbm html html.parser mimetypes
smtplib imaplib ftplib poplib wave colorsys random math cmath numbers string re""".split()
for m in mods:
    try:
        __import__(m)
    except Exception:
        pass
keep = []
t0 = time.time()
i = 0
while time.time() - t0 < float(sys.argv[1]):
    i += 1
    keep.append({"k": i, "v": str(i) * 3, "l": [i, i + 1]})
    if len(keep) > 20000:
        keep = keep[10000:]
    if i % 2000 == 0:
        json_mod = sys.modules["json"]
        json_mod.dumps(keep[-50:])
        sys.modules["decimal"].Decimal(i) / 7
        time.sleep(0.01)

"""Fixed texts a model reads once at load to see its activations' largest values (the outlier
channels integer products move into the weights: :mod:`ragidx.indexer.model.int8_products`).

Written for ragidx, in the kinds of text people index (prose, instructions, code, a table, a
question) and in several languages and scripts, so the channels found are the model's own and not
one language's. They are fixed: the same model always gets the same integer weights, so an index
built today and a query tomorrow compute alike.
"""

CALIBRATION_TEXTS = (
    "The lighthouse keeper climbed the stairs at dusk, trimmed the wick and wrote the weather in "
    "the log: wind from the north-west, a heavy swell, two fishing boats in before dark. In the "
    "morning the supply ship was late again, and the radio carried only static.",
    "To reset a forgotten password, open Settings, choose Accounts, then Security, and select "
    "'Reset password'. A code is sent to the recovery address within five minutes. If it does not "
    "arrive, check the spam folder or ask an administrator to unlock the account.",
    "def merge_intervals(intervals):\n    ordered = sorted(intervals)\n    merged = [ordered[0]]\n"
    "    for start, end in ordered[1:]:\n        if start <= merged[-1][1]:\n"
    "            merged[-1][1] = max(merged[-1][1], end)\n        else:\n"
    "            merged.append([start, end])\n    return merged",
    "| Quarter | Revenue (EUR) | Change |\n| Q1 2025 | 1,204,500 | +4.2% |\n"
    "| Q2 2025 | 1,187,300 | -1.4% |\n| Q3 2025 | 1,312,800 | +10.6% |",
    "Which medications should not be taken together with ibuprofen, and how long after the last "
    "dose is it safe to drink alcohol?",
    "Die Sitzung begann um neun Uhr. Der Ausschuss beriet über den Haushalt des kommenden Jahres, "
    "die Sanierung der Brücke am Stadtrand und die Frage, ob die Bibliothek sonntags öffnen soll.",
    "El contrato se renueva automáticamente cada año salvo que una de las partes lo cancele por "
    "escrito con treinta días de antelación. Las tarifas pueden cambiar con previo aviso.",
    "如果设备无法开机，请先确认电源适配器已连接，然后长按电源键十秒钟。指示灯仍不亮时，请联系售后服务。",
    "会議の議事録は金曜日までに共有してください。次回は新しい検索機能の設計について話し合います。",
)

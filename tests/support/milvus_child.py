"""Direct pymilvus calls for tests/test_milvus.py, run in a child process: a milvus-lite file
stays locked by the process that opened it, so the test process never opens one itself.

Usage: python tests/milvus_child.py ACTION URI COLLECTION [JSON]; prints JSON.
"""

from __future__ import annotations

import json
import sys

from pymilvus import DataType, MilvusClient


def main() -> None:
    action, uri, collection = sys.argv[1:4]
    argument = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
    client = MilvusClient(uri)
    result = None
    if action == "create-foreign":  # a collection of the same name made by another tool
        schema = MilvusClient.create_schema(auto_id=True)
        schema.add_field("pk", DataType.INT64, is_primary=True)
        schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=argument)
        client.create_collection(collection, schema=schema)
    elif action == "collections":
        result = client.list_collections()
    elif action == "hold":  # keep the file open (milvus-lite's lock) until stdin closes
        print(json.dumps("holding"), flush=True)
        sys.stdin.read()
    else:
        client.load_collection(collection)
        if action == "rows":
            rows = client.query(collection, filter="chunk_id >= 0", output_fields=["*"], limit=16384)
            result = {row["chunk_id"]: {**row, "vector": [float(x) for x in row["vector"]]} for row in rows}
        elif action == "delete":
            client.delete(collection, ids=argument)
        elif action == "upsert":
            client.upsert(collection, argument)
        elif action == "owner":
            client.alter_collection_properties(collection, properties={"ragidx.index_id": argument})
    client.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()

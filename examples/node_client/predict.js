// Calls a recordprep export through TensorFlow Serving's REST API with raw records as tf.train.Examples.
//
//   npm install            # protobufjs, from the npm registry
//   node predict.js URL KEYS RECORDS.jsonl [SIGNATURE]
//
// URL: http://HOST:8501/v1/models/NAME:predict. KEYS: the export's assets.extra/recordprep_config.json
// (its "example_keys": the source paths the model reads) or a JSON list of them. RECORDS.jsonl: one JSON
// record per line. Prints the response's "predictions" as JSON. The mapping (docs/serving.md): an absent or
// null field is left out; strings -> bytes_list, integers and booleans (0/1) -> int64_list, other numbers ->
// float_list; a list -> a feature of several values (null items and nested records cannot travel);
// paths like user.id and items[].price walk records and lists.
"use strict";
const fs = require("fs");
const protobuf = require("protobufjs");

const repeated = (type, packed) => ({ value: { rule: "repeated", type, id: 1, ...(packed ? { options: { packed: true } } : {}) } });
const root = protobuf.Root.fromJSON({ nested: { tensorflow: { nested: {
  BytesList: { fields: repeated("bytes", false) },
  FloatList: { fields: repeated("float", true) },
  Int64List: { fields: repeated("int64", true) },
  Feature: {
    oneofs: { kind: { oneof: ["bytes_list", "float_list", "int64_list"] } },
    fields: { bytes_list: { type: "BytesList", id: 1 }, float_list: { type: "FloatList", id: 2 }, int64_list: { type: "Int64List", id: 3 } },
  },
  Features: { fields: { feature: { keyType: "string", type: "Feature", id: 1 } } },
  Example: { fields: { features: { type: "Features", id: 1 } } },
} } } });
const Example = root.lookupType("tensorflow.Example");

// The value at a source path: keys step into records, [] into a list's items (a list results).
function walk(value, path) {
  const steps = path.match(/[^.[\]]+|\[\]/g) || [];
  if (/\[(?!\])/.test(path)) throw new Error(`${path}: only .key and [] steps are supported here`);
  let values = [value], list = false;
  for (const step of steps) {
    if (step === "[]") {
      list = true;
      values = values.flatMap((v) => (Array.isArray(v) ? v : v == null ? [] : [v]));
    } else {
      values = values.map((v) => (v !== null && typeof v === "object" && !Array.isArray(v) ? v[step] : undefined));
    }
  }
  return list ? values : values[0];
}

function feature(key, value) {
  const items = Array.isArray(value) ? value : [value];
  if (items.some((x) => x === null || x === undefined || typeof x === "object")) {
    throw new Error(`${key}: a null or nested item cannot travel in a tf.train.Example`);
  }
  if (items.every((x) => typeof x === "string")) return { bytes_list: { value: items.map((s) => Buffer.from(s, "utf8")) } };
  if (items.every((x) => typeof x === "boolean" || Number.isInteger(x))) return { int64_list: { value: items.map(Number) } };
  if (items.every((x) => typeof x === "number")) return { float_list: { value: items } };
  throw new Error(`${key}: one Example feature holds one type`);
}

function toExample(record, keys) {
  const features = {};
  for (const key of keys) {
    const v = walk(record, key);
    if (v !== null && v !== undefined) features[key] = feature(key, v);
  }
  return Example.encode(Example.fromObject({ features: { feature: features } })).finish();
}

async function main() {
  const [url, keysFile, recordsFile, signature = "serve_examples"] = process.argv.slice(2);
  if (!recordsFile) throw new Error("usage: node predict.js URL KEYS RECORDS.jsonl [SIGNATURE]");
  const doc = JSON.parse(fs.readFileSync(keysFile, "utf8"));
  const keys = Array.isArray(doc) ? doc : doc.example_keys;
  const records = fs.readFileSync(recordsFile, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
  const instances = records.map((r) => ({ examples: { b64: Buffer.from(toExample(r, keys)).toString("base64") } }));
  const response = await fetch(url, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ signature_name: signature, instances }),
  });
  const body = await response.json();
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}: ${body.error}`);
  process.stdout.write(JSON.stringify(body.predictions) + "\n");
}

main().catch((e) => { process.stderr.write(`${e.message}\n`); process.exit(1); });

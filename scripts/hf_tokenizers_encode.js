#!/usr/bin/env node
// Token ids of a tokenizer.json as Hugging Face's JavaScript `tokenizers` port computes them
// (npm @huggingface/tokenizers, fetched by scripts/fetch_tokenizers_js.sh), in the format of
// `titan tokenizer encode`: ids space-separated, one output line per input line, or (--whole) the
// whole input as one text on one line. Every text must also decode back to itself; a text that
// does not is reported on stderr and the exit code is 1.
//   node scripts/hf_tokenizers_encode.js PACKAGE_DIR TOKENIZER_JSON INPUT_FILE [--whole]
'use strict';
const fs = require('fs');
const path = require('path');
const {writeIds} = require(path.join(__dirname, 'encode_lines.js'));

const [packageDir, tokenizerJson, input, mode] = process.argv.slice(2);
if (!packageDir || !tokenizerJson || !input) {
  process.stderr.write(
      'usage: hf_tokenizers_encode.js PACKAGE_DIR TOKENIZER_JSON INPUT_FILE [--whole]\n');
  process.exit(2);
}
const {Tokenizer} = require(path.resolve(packageDir, 'dist/tokenizers.cjs'));
const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerJson, 'utf-8')), {});

let failures = 0;
function ids_of(text) {
  const ids = tokenizer.encode(text, {add_special_tokens: false}).ids;
  // decode() refuses an empty list.
  const back = ids.length ? tokenizer.decode(ids, {clean_up_tokenization_spaces: false}) : '';
  if (back !== text && failures++ < 5) {
    process.stderr.write(`decode(encode(x)) != x for x = ${JSON.stringify(text.slice(0, 200))}\n`);
  }
  return ids;
}

writeIds(input, mode, ids_of);
process.exit(failures > 0 ? 1 : 0);

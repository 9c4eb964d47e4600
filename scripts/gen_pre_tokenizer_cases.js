#!/usr/bin/env node
// Generates tests/unit/tokenizer/pre_tokenizer_cases.json: adversarial strings and how the GPT-2
// and Llama-3 pre-tokenizer regexes split them, as computed by V8's regex engine. The C++
// scanners must split them identically. Run: node scripts/gen_pre_tokenizer_cases.js > <file>
'use strict';

const gpt2 = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
// (?i:...) spelled out, since this Node lacks inline modifiers; U+017F folds to 's'.
const llama3 = new RegExp(
    "'(?:[sS\\u017f]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" +
        '\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+',
    'gu');

const alphabet = [
  ' ', ' ', ' ', '\n', '\n', '\r', '\t', '\u00a0', '\u3000', '\u2028', '\ufeff', '\u0085', 'a',
  'b', 'e', 'r', 's', 't', 'v', 'l', 'm', 'd', 'S', 'T', 'R', 'E', 'L', 'D', 'é', '世', 'Ж',
  '0', '1', '9', '\u0663', '\u216b', '\u00bd', "'", "'", '\u017f', '.', ',', '!', '(', '-',
  '\u{1F642}', '\u0301', '$', '\u200b'];

// Deterministic generator so regenerating gives the same file.
let seed = 12345;
const rand = (n) => {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed % n;
};

const cases = [
  'Hello world', "I'm fine, you're not. They'll've", "DON'T 'S 'Re", '  leading  and trailing  ',
  'a\n\nb\r\n\r\nc \n d', 'x   \n  y', '12345 678 9', 'emoji 🙂🙂 and 世界 CJK', '\t\ttabs\t',
  'a.b!!c??', "''s 's's", 'end with spaces   ', '   ', '\n', ' \n ', 'price: $1,234.56!',
];
for (let i = 0; i < 400; i++) {
  const len = 1 + rand(24);
  let s = '';
  for (let j = 0; j < len; j++) s += alphabet[rand(alphabet.length)];
  cases.push(s);
}
const split = (re, s) => Array.from(s.matchAll(re), (m) => m[0]);
const out = cases.map((s) => ({text: s, gpt2: split(gpt2, s), llama3: split(llama3, s)}));
process.stdout.write(JSON.stringify(out, null, 0).replace(/\},\{/g, '},\n{') + '\n');

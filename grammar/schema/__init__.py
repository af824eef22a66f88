"""JSON Schema before compilation: which keywords xgrammar supports (`support`), and the rewrites that
keep a schema's meaning while making it compilable (`normalize` and its steps: refs, upgrade, merge,
simplify, disjoint, patterns, tidy). Pure dict-to-dict functions; imports nothing outside this folder."""

import json, random
random.seed(1)
d = {}
for i in range(300000):
    d[f"key{i}"] = [i, str(i) * 3, {"v": i * 0.5}]
s = json.dumps(d)
back = json.loads(s)
words = [w for w in s.split('"') if w.startswith("key")]
counts = {}
for w in words:
    counts[w[:5]] = counts.get(w[:5], 0) + 1
print(len(back), len(counts))

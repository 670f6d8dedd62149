import json, struct, sys, os, math, glob
sys.path.insert(0, '/work/main/bench')
from tabular import solve
run = sys.argv[1]
m = json.load(open(os.path.join(run, 'run.json')))
t = m['table']; task = m['task']
rows = []
with open(t['csv']) as f:
    header = f.readline().strip().split(',')
    ti = header.index(t['target'])
    for line in f:
        if line.strip(): rows.append(list(map(float, line.split(','))))
test = set(t.get('test_rows') or [])
tr = [r for i, r in enumerate(rows) if i not in test]
X = [[(v - mu) / sd for v, mu, sd in zip([c for j, c in enumerate(r) if j != ti], t['feature_mean'], t['feature_std'])] + [1.0] for r in tr]
y = [(r[ti] - task['mean']) / task['std'] for r in tr]
sig = m['likelihood']['noise']['std']; s = m['prior']['std']
d = len(X[0])
A = [[sum(x[i] * x[j] for x in X) / sig**2 + (1 / s**2 if i == j else 0) for j in range(d)] for i in range(d)]
b = [sum(x[i] * yy for x, yy in zip(X, y)) / sig**2 for i in range(d)]
mu = solve(A, b)
cov = [solve(A, [1.0 if k == j else 0.0 for k in range(d)]) for j in range(d)]
samples = []
for p in sorted(glob.glob(os.path.join(run, '**', 'sample-*.safetensors'), recursive=True)):
    raw = open(p, 'rb').read(); n = struct.unpack('<Q', raw[:8])[0]; h = json.loads(raw[8:8 + n]); body = raw[8 + n:]
    def get(name):
        a, bb = h[name]['data_offsets']; return list(struct.unpack('<%df' % ((bb - a) // 4), body[a:bb]))
    samples.append(get('fc1.weight') + get('fc1.bias'))
K = len(samples)
mean = [sum(v[i] for v in samples) / K for i in range(d)]
C = [[sum((v[i] - mean[i]) * (v[j] - mean[j]) for v in samples) / (K - 1) for j in range(d)] for i in range(d)]
z = max(abs(mean[i] - mu[i]) / math.sqrt(cov[i][i]) for i in range(d))
fro = math.sqrt(sum((C[i][j] - cov[i][j])**2 for i in range(d) for j in range(d))) / math.sqrt(sum(cov[i][j]**2 for i in range(d) for j in range(d)))
print(f"{os.path.basename(run)}: {K} samples, max |mean error|/sd {z:.3f}, rel Frobenius {fro:.3f}, post sd range {min(math.sqrt(cov[i][i]) for i in range(d)):.4f}-{max(math.sqrt(cov[i][i]) for i in range(d)):.4f}")

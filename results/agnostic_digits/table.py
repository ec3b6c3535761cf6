import sys, pandas as pd, numpy as np
from scipy import stats
r=pd.read_csv(sys.argv[1]+'/runs.csv')
r=r[r.method!='(data)']
methods=list(dict.fromkeys(r.method))
def ci(x):
    x=np.asarray(x,float); n=len(x); m=x.mean()
    h=stats.t.ppf(.975,n-1)*x.std(ddof=1)/np.sqrt(n) if n>1 else float('nan'); return m,h
for which in ('best','final'):
    print(f"\n{which}: | metric | "+" | ".join(methods)+" |")
    for met in ('local_accuracy_worst10','local_accuracy_mean','local_accuracy_std','global_accuracy'):
        row=[]
        for m in methods:
            v=r[(r.method==m)&(r.metric==f'{which}.{met}')].sort_values('seed').value
            a,h=ci(v); row.append(f"{a:.3f} ± {h:.3f}")
        print(f"| {met} | "+" | ".join(row)+" |")
print("\nbest_round", {m: r[(r.method==m)&(r.metric=='best_round')].value.tolist() for m in methods})
# paired vs fedavg
for which in ('best','final'):
  for met in ('local_accuracy_worst10','local_accuracy_mean'):
    base=r[(r.method=='fedavg')&(r.metric==f'{which}.{met}')].sort_values('seed').value.values
    for m in methods[1:]:
        v=r[(r.method==m)&(r.metric==f'{which}.{met}')].sort_values('seed').value.values
        d=v-base; a,h=ci(d); print(which,met,m,f"Δ {a:+.3f} [{a-h:+.3f}, {a+h:+.3f}] won {(d>0).sum()}/{len(d)}")

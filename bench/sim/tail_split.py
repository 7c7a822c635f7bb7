#!/usr/bin/env python3
"""List-scheduling simulation of the gathered attention kernel's tail (perf-notes, ring session 9).

Equal tiles (one time unit each) go, in order, to whichever CTA frees first: compute CTAs start
at 0, communicator CTAs join at `tcomm`. The last `split` tiles may run as two halves of
0.5 + `ovh` each. Prints, per shape, the makespan unsplit and the speed-up for a few split
counts. `python3 bench/sim/tail_split.py`
"""
import heapq, random
def run(T, C, comm, tcomm, split, jitter=0.02, ovh=0.02, seed=0):
    rnd = random.Random(seed)
    items = [1.0]*(T-split) + [0.5+ovh]*(2*split)
    h = [(0.0,i) for i in range(C-comm)] + [(tcomm,i) for i in range(comm)]
    heapq.heapify(h)
    end = 0
    for d in items:
        t,i = heapq.heappop(h)
        t2 = t + d*(1+rnd.uniform(-jitter,jitter))
        end = max(end,t2)
        heapq.heappush(h,(t2,i))
    return end
for T,label in [(2048,'ring8K B4'),(512,'ring8K B1'),(4096,'uly8K'),(1024,'x')]:
  C=132
  for comm,tc in [(8,3.1),(4,5.5),(16,1.6)]:
    base = sum(run(T,C,comm,tc,0,seed=s) for s in range(20))/20
    best = None
    res=[]
    for split in [T%C, T%C + C//2, T%C + C, (T%C)//2]:
        if split> T: continue
        m = sum(run(T,C,comm,tc,split,seed=s) for s in range(20))/20
        res.append((split, round(base/m,4)))
    ideal = (T + comm*tc)/C  # not exact
    print(label, 'comm',comm, 'base',round(base,3), 'work bound', round((T+0*comm)/C + comm*tc/C,3), res)

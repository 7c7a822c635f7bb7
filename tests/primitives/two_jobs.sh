#!/usr/bin/env bash
# Two jobs on the same GPUs at the same time must not collide (socket names, heaps, counters).
set -u
run="$1"; prog="$2"
[ "$("$run" --count-gpus)" -ge 2 ] || { echo "skipped: needs 2 GPUs"; exit 77; }
filter='Signal.*:StoreAsync.Bf16:Reduce.SumBf16'
"$run" -n 2 -- "$prog" --gtest_filter="$filter" >/tmp/weave-two-jobs-a.$$ 2>&1 & a=$!
"$run" -n 2 -- "$prog" --gtest_filter="$filter" >/tmp/weave-two-jobs-b.$$ 2>&1 & b=$!
wait $a; sa=$?; wait $b; sb=$?
cat /tmp/weave-two-jobs-a.$$ /tmp/weave-two-jobs-b.$$; rm -f /tmp/weave-two-jobs-[ab].$$
echo "job A exit $sa, job B exit $sb"
[ $sa -eq 0 ] && [ $sb -eq 0 ]

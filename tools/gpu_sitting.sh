# The second half of the one-sitting re-run (issue 28): the miss path's GPU tests, then notebooks
# 03-07 with SAVE_RESULTS=True, each under what is left of one deadline (DEADLINE_S from the start),
# the outputs packed after every step so that a cut-off call still brings back what finished.
source tools/gpu_env.sh
start=$(date +%s); deadline=$(( start + ${DEADLINE_S:-540} ))
left() { echo $(( deadline - $(date +%s) )); }
pack() { tar czf $OUT/sitting.tgz build data/bench 2>/dev/null; }
mkdir -p build
timeout $(( $(left) < 110 ? $(left) : 110 )) python3 -m pytest -q -m gpu -p no:xdist tests/gpu/test_gpu_prefix_cache_miss.py > $OUT/miss-gpu.log 2>&1
echo "miss gpu tests rc $? at $(( $(date +%s) - start )) s"; tail -5 $OUT/miss-gpu.log
for nb in ${NOTEBOOKS:-03 04 05 06 07}; do
  [ $(left) -lt 20 ] && { echo "no time left for $nb"; break; }
  s=$(date +%s)
  timeout $(left) python3 -m labkit notebooks --out build --only $nb -p SAVE_RESULTS=True > $OUT/nb$nb.log 2>&1
  echo "nb $nb rc $? $(( $(date +%s) - s )) s"; tail -2 $OUT/nb$nb.log; pack
done
pack; date -u

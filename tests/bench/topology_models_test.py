#!/usr/bin/python3
"""bench/topology_models.py against the seeds and against definitions
computed another way:
  - BOM on Rina's Fig. 4: the flows and the B0/4 its text derives (s2's
    uplink 4 flows, s4's 2, the job at B0/4); Lemma 1 (no INA switch: 1/n);
  - the deployment curve's exact means against a direct enumeration of
    every subset (itertools.combinations, no binomial weights), on Fig. 4
    and on the k=4 fat-tree at small m; the curve's shape: 1/15 with no
    box, all boxes 1, rising, and the intro's claim that 80% INA switches
    give at most about half the throughput;
  - E[max of n standard normals] against its closed forms (n = 2: 1/sqrt(pi),
    n = 3: 3/(2 sqrt(pi))), the published n = 5 value, and a numpy Monte
    Carlo at n = 16; eq. (3)'s sqrt(2 ln n) overestimates at small n;
  - steps and bytes per scheme from their definitions."""
import itertools
import math
import os
import subprocess
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import topology_models as tm  # noqa: E402


def brute_mean(g, ps, workers, switches, m):
    tree = tm.aggregation_tree(g, ps, workers)
    vals = [tm.bom(tree, workers, set(c))[1] for c in itertools.combinations(switches, m)]
    return sum(vals) / len(vals), min(vals), max(vals)


class Bom(unittest.TestCase):
    def test_figure4(self):
        g, ps, workers, _ = tm.figure4()
        tree = tm.aggregation_tree(g, ps, workers)
        flows, t = tm.bom(tree, workers, {"s3"}, b0=100.0)
        self.assertEqual((flows["s2"], flows["s3"], flows["s4"]), (4, 1, 2))
        self.assertEqual(t, 25.0)  # B0 / 4
        # Lemma 1: regular switches only, 7 workers: B0 / 7.
        self.assertAlmostEqual(tm.bom(tree, workers, set())[1], 1 / 7)

    def test_curve_equals_direct_enumeration(self):
        cases = [tm.figure4(), tm.fat_tree(4)]
        for (g, ps, workers, switches), ms in zip(cases, [range(4), range(3)]):
            rows = tm.deployment_curve(g, ps, workers, switches)
            for m in ms:
                mean, least, most = brute_mean(g, ps, workers, switches, m)
                self.assertAlmostEqual(rows[m][1], mean, places=12)
                self.assertEqual((rows[m][2], rows[m][3]), (least, most))

    def test_fat_tree_shape(self):
        g, ps, workers, switches = tm.fat_tree(4)
        self.assertEqual((len(workers) + 1, len(switches)), (16, 20))
        rows = tm.deployment_curve(g, ps, workers, switches)
        self.assertAlmostEqual(rows[0][1], 1 / 15)
        self.assertEqual(rows[-1][1], 1.0)
        means = [r[1] for r in rows]
        self.assertTrue(all(a < b for a, b in zip(means, means[1:])), means)
        self.assertLessEqual(rows[16][1], 0.5)  # 80% of the switches: about half, at best
        self.assertEqual(rows[16][3], 1.0)  # though the right 80% reach all of it

    def test_bad_topology(self):
        with self.assertRaisesRegex(ValueError, "k must be even"):
            tm.fat_tree(3)
        with self.assertRaisesRegex(ValueError, "not connected"):
            tm.aggregation_tree({"ps": {"s"}, "s": {"ps"}, "h9": set()}, "ps", ["h9"])


class Stragglers(unittest.TestCase):
    def test_expected_max(self):
        self.assertAlmostEqual(tm.expected_max_std_normal(1), 0.0, places=9)
        self.assertAlmostEqual(tm.expected_max_std_normal(2), 1 / math.sqrt(math.pi), places=9)
        self.assertAlmostEqual(tm.expected_max_std_normal(3), 3 / (2 * math.sqrt(math.pi)), places=9)
        self.assertAlmostEqual(tm.expected_max_std_normal(5), 1.16296, places=5)
        rng = np.random.default_rng(5)
        mc = rng.standard_normal((400000, 16)).max(axis=1).mean()
        self.assertAlmostEqual(tm.expected_max_std_normal(16), mc, delta=0.005)
        for n in (2, 3, 5, 16):  # eq. (3)'s approximation is high
            self.assertGreater(math.sqrt(2 * math.log(n)), tm.expected_max_std_normal(n))

    def test_eq3_as_printed(self):
        self.assertAlmostEqual(tm.rina_eq3(8, 1.0, 4.0, 0.5), 8 + 4 + 8 * 0.5 * math.sqrt(2 * math.log(8)))
        self.assertLess(tm.rina_eq3(8, 1, 4, 0.5), tm.rina_eq3(16, 1, 4, 0.5))
        self.assertLess(tm.rina_eq3(8, 1, 4, 0.5), tm.rina_eq3(8, 1, 4, 1.0))

    def test_schemes(self):
        racks = tm.parse_racks("3+,2+,1")
        self.assertEqual(tm.groups(racks), [3, 2, 1])
        s = tm.schemes(racks, 6.0)
        self.assertEqual(s["flat ring"], (10, 2 * 5 / 6 * 6.0, 6))
        self.assertEqual(s["one box"][0], 1)
        steps, nbytes, n = s["rina"]
        self.assertEqual((steps, n), (2 * (3 - 1) + 2, 6))
        # The most loaded: rack 1's member 0, carrying lanes 0 and 2 of 3
        # (2 x 6 up, then the group ring's 2(G - 1)/G of 2/3 of 6).
        self.assertAlmostEqual(nbytes, 12 + 2 * 2 / 3 * 6 * 2 / 3)
        # No box anywhere: Rina is the flat ring; one rack with a box: one pass.
        self.assertEqual(tm.schemes(tm.parse_racks("2,1"))["rina"][0], 2 * (3 - 1))
        self.assertEqual(tm.schemes(tm.parse_racks("4+"))["rina"][:2], (1, 1.0))
        self.assertLess(tm.straggler_time(6, 6, 1, 0, 0.5), tm.straggler_time(10, 6, 1, 0, 0.5))

    def test_cli(self):
        exe = [sys.executable, os.path.join(HERE, "..", "..", "bench", "topology_models.py")]
        out = subprocess.run(exe + ["fig4"], capture_output=True, text=True, check=True).stdout
        self.assertIn("worker throughput: B0/4", out)
        bad = subprocess.run(exe + ["steps", "--racks", "2,0"], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("a rack needs at least one worker: '0'", bad.stderr)


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))

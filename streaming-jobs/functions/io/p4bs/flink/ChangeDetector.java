package io.p4bs.flink;

import java.util.ArrayDeque;

/**
 * The metrics job's change detector, a smoothed z-score of f (Brakel), apart from Flink so that
 * the shared test vector can run it (tests/fixtures/change-detector-vector.json,
 * tests/java/ChangeDetectorVector.java). Its Python twin is the offline simulator's
 * (eval/p4bs_eval/change_detector.py); both must reproduce the vector.
 */
public final class ChangeDetector {
  /** A flat f has deviation 0; a later move of f is then a change with a finite z. */
  static final double DEVIATION_FLOOR = 1e-9;

  private ChangeDetector() {}

  /**
   * f against the mean and deviation of the last lag filtered values (while fewer, f joins them
   * and z is 0); a change (|z| above the threshold) enters the filter damped by the influence.
   * Updates {@code filtered}, which the caller keeps from window to window. Returns {z, 1 if a
   * change else 0}.
   */
  public static double[] detect(
      ArrayDeque<Double> filtered, double f, int lag, double threshold, double influence) {
    if (filtered.size() < lag) {
      filtered.addLast(f);
      return new double[] {0.0, 0};
    }
    int n = filtered.size();
    double[] values = new double[n];
    int i = 0;
    for (double v : filtered) {
      values[i++] = v;
    }
    double mean = exactSum(values) / n;
    double[] squares = new double[n];
    for (i = 0; i < n; i++) {
      double d = values[i] - mean;
      squares[i] = d * d;
    }
    double deviation = Math.sqrt(exactSum(squares) / n);
    double z = (f - mean) / Math.max(deviation, DEVIATION_FLOOR);
    boolean change = Math.abs(z) > threshold;
    double previous = filtered.peekLast();
    filtered.pollFirst();
    filtered.addLast(change ? influence * f + (1 - influence) * previous : f);
    return new double[] {z, change ? 1 : 0};
  }

  /**
   * The exactly rounded sum of the values (Shewchuk's partials with a half-even correction of the
   * last step, the algorithm of Python's math.fsum), so a flat series has exactly zero deviation.
   */
  static double exactSum(double[] values) {
    double[] partials = new double[values.length + 1];
    int used = 0;
    for (double value : values) {
      double x = value;
      int i = 0;
      for (int j = 0; j < used; j++) {
        double y = partials[j];
        if (Math.abs(x) < Math.abs(y)) {
          double t = x;
          x = y;
          y = t;
        }
        double hi = x + y;
        double lo = y - (hi - x);
        if (lo != 0.0) {
          partials[i++] = lo;
        }
        x = hi;
      }
      partials[i] = x;
      used = i + 1;
    }
    if (used == 0) {
      return 0.0;
    }
    int n = used;
    double hi = partials[--n];
    double lo = 0.0;
    while (n > 0) {
      double x = hi;
      double y = partials[--n];
      hi = x + y;
      double yr = hi - x;
      lo = y - yr;
      if (lo != 0.0) {
        break;
      }
    }
    if (n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0))) {
      double y = lo * 2.0;
      double x = hi + y;
      double yr = x - hi;
      if (y == yr) {
        hi = x;
      }
    }
    return hi;
  }
}

import io.p4bs.flink.ChangeDetector;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;

/**
 * Runs the metrics job's change detector (ChangeDetector in the functions jar) on the f values
 * of stdin, one a line, with the settings lag, threshold and influence as arguments; prints per
 * value "z change" (change 1 or 0), z as Double.toString writes it (it reads back exactly).
 * tests/unit/test_change_detector.py compiles it against the jar and feeds it the shared vector.
 */
public final class ChangeDetectorVector {
  private ChangeDetectorVector() {}

  public static void main(String[] args) throws IOException {
    int lag = Integer.parseInt(args[0]);
    double threshold = Double.parseDouble(args[1]);
    double influence = Double.parseDouble(args[2]);
    ArrayDeque<Double> filtered = new ArrayDeque<>();
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    StringBuilder out = new StringBuilder();
    for (String line = in.readLine(); line != null; line = in.readLine()) {
      double[] result =
          ChangeDetector.detect(filtered, Double.parseDouble(line), lag, threshold, influence);
      out.append(result[0]).append(' ').append((int) result[1]).append('\n');
    }
    System.out.print(out);
  }
}

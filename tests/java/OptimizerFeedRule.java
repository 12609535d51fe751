import io.p4bs.flink.OptimizerFeed;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * Runs the metrics job's optimizer feed rule (OptimizerFeed in the functions jar) on the windows
 * of stdin, one a line: "LINK FIRST PREVIOUS_N N PREVIOUS_SRTT SRTT PREVIOUS_RTT_MIN RTT_MIN
 * CHANGE ALERT START END" (FIRST, CHANGE and ALERT 0 or 1; an absent SRTT or RTT_min "-"), with
 * the deadband, the heartbeat in ns and the thinned policies (comma-separated) as arguments. Prints
 * per window 1 if it passes, else 0, then a line of whether each policy on the last argument
 * (comma-separated) is thinned. tests/unit/test_optimizer_feed.py compiles it against the jar.
 */
public final class OptimizerFeedRule {
  private OptimizerFeedRule() {}

  public static void main(String[] args) throws IOException {
    OptimizerFeed feed =
        new OptimizerFeed(
            Double.parseDouble(args[0]), Long.parseLong(args[1]), Arrays.asList(args[2].split(",")));
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    StringBuilder out = new StringBuilder();
    for (String line = in.readLine(); line != null; line = in.readLine()) {
      String[] f = line.split(" ");
      boolean passes =
          feed.passes(
              f[0],
              f[1].equals("1"),
              Integer.parseInt(f[2]),
              Integer.parseInt(f[3]),
              nullable(f[4]),
              nullable(f[5]),
              nullable(f[6]),
              nullable(f[7]),
              f[8].equals("1"),
              f[9].equals("1"),
              Long.parseLong(f[10]),
              Long.parseLong(f[11]));
      out.append(passes ? '1' : '0').append('\n');
    }
    for (String policy : args[3].split(",")) {
      out.append(feed.thins(policy) ? '1' : '0');
    }
    System.out.println(out);
  }

  private static Long nullable(String value) {
    return value.equals("-") ? null : Long.valueOf(value);
  }
}

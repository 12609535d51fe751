"""The optimizer service (`p4bs optimizer run`), one part a module:

- `service`: the service that wires the parts: the Kafka loop, the drivers, the transactions;
- `controller`: one link's controller, its policy and safety guards (`LinkController`);
- `quiet`: which links may have gone quiet, the stale check's candidates (`QuietWatch`);
- `ownership`: the partitions the group gives and takes back, and the links' handover;
- `transaction`: what the next transaction holds (states staged, decision records);
- `fit_pool`: the decide threads and the GP fit processes;
- `links_follower`: links added, changed and removed through the links topic;
- `stats`: the counters the progress line shows.
"""

from p4bs_optimizer.service.service import OptimizerService, summary_line

__all__ = ["OptimizerService", "summary_line"]

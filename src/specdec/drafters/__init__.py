"""What training a drafter head needs beyond the head itself: training text and feature cache
(`features`), finding the heads shipped for a model (`shipped`), and `specdec train` (`train`).
Each head lives with its method family: `specdec.proposers.eagle.head`, `specdec.proposers.medusa.head`,
`specdec.proposers.hydra.head`."""

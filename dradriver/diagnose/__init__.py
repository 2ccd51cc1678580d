"""Why is my GPU pod Pending: `explain` evaluates a claim's selectors against what is
published, as the scheduler does, and names the first step that fails; `doctor` walks the
node's layers bottom-up. Pure judgement here; the commands gather the facts."""
